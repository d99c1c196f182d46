// Package resp writes Redis commands and reads Redis replies in RESP2, for
// the places that speak to a Redis server without go-redis: redislock's own
// pipelined connection, the test servers' health checks and the bench
// module's statistics.
package resp

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// Error is an error reply, its text without the leading '-'. Its
// RedisError method makes it a go-redis redis.Error.
type Error string

// Error returns the reply's text.
func (e Error) Error() string { return string(e) }

// RedisError marks Error as a reply of the server (go-redis' redis.Error).
func (Error) RedisError() {}

// AppendHeader appends the header of an array ('*') or bulk string ('$')
// of n elements or bytes.
func AppendHeader(b []byte, kind byte, n int) []byte {
	b = append(b, kind)
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, '\r', '\n')
}

// AppendBulk appends s as a bulk string.
func AppendBulk(b []byte, s string) []byte {
	b = AppendHeader(b, '$', len(s))
	b = append(b, s...)
	return append(b, '\r', '\n')
}

// AppendCommand appends the command args.
func AppendCommand(b []byte, args ...string) []byte {
	b = AppendHeader(b, '*', len(args))
	for _, a := range args {
		b = AppendBulk(b, a)
	}
	return b
}

// Read reads one reply: a string for a simple or bulk string, an int64
// for an integer, nil for a null bulk string or array, []any for an array
// and an Error for an error reply, at any depth. The error is only for a
// failure to read a reply (the connection, or bytes that are not RESP2).
func Read(br *bufio.Reader) (any, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return nil, err
	}
	kind, body, err := header(line)
	if err != nil {
		return nil, err
	}
	switch kind {
	case '$':
		n, err := length(body, "bulk string")
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(br, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := length(body, "array")
		if err != nil || n < 0 {
			return nil, err
		}
		a := make([]any, n)
		for i := range a {
			if a[i], err = Read(br); err != nil {
				return nil, err
			}
		}
		return a, nil
	}
	return simple(kind, body)
}

// Parse parses the reply at the start of b as Read reads it and returns
// it with its length in bytes; n is 0 (err nil) when b holds only the
// start of a reply.
func Parse(b []byte) (v any, n int, err error) {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return nil, 0, nil
	}
	kind, body, err := header(b[:i+1])
	if err != nil {
		return nil, 0, err
	}
	n = i + 1
	switch kind {
	case '$':
		l, err := length(body, "bulk string")
		if err != nil || l < 0 {
			return nil, n, err
		}
		if len(b) < n+l+2 {
			return nil, 0, nil
		}
		return string(b[n : n+l]), n + l + 2, nil
	case '*':
		l, err := length(body, "array")
		if err != nil || l < 0 {
			return nil, n, err
		}
		a := make([]any, l)
		for j := range a {
			v, m, err := Parse(b[n:])
			if err != nil || m == 0 {
				return nil, 0, err
			}
			a[j] = v
			n += m
		}
		return a, n, nil
	}
	v, err = simple(kind, body)
	return v, n, err
}

// header splits a reply's first line into its type byte and its body.
func header(line []byte) (byte, []byte, error) {
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return 0, nil, fmt.Errorf("resp: malformed line %q", line)
	}
	return line[0], line[1 : len(line)-2], nil
}

// simple returns a simple string, error or integer reply.
func simple(kind byte, body []byte) (any, error) {
	switch kind {
	case '+':
		return string(body), nil
	case '-':
		return Error(body), nil
	case ':':
		n, err := strconv.ParseInt(string(body), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("resp: bad integer %q", body)
		}
		return n, nil
	}
	return nil, fmt.Errorf("resp: unknown reply type %q", kind)
}

// length parses the length of a bulk string or array (kind names it in
// errors); -1 is null.
func length(body []byte, kind string) (int, error) {
	n, err := strconv.Atoi(string(body))
	if err != nil || n < -1 {
		return 0, fmt.Errorf("resp: bad %s length %q", kind, body)
	}
	return n, nil
}

// Do sends the command args to the server at addr on a connection of its
// own and returns the reply, an error reply as an Error error. ctx bounds
// it, or timeout when ctx has no deadline.
func Do(ctx context.Context, addr string, timeout time.Duration, args ...string) (any, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(timeout)
	}
	d := net.Dialer{Deadline: deadline}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := c.SetDeadline(deadline); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := c.Write(AppendCommand(nil, args...)); err != nil {
		return nil, ctxErr(ctx, err)
	}
	v, err := Read(bufio.NewReader(c))
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	if e, ok := v.(Error); ok {
		return nil, e
	}
	return v, nil
}

// ctxErr names ctx's end as the cause of err, if ctx ended.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}
