package testserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// defaultDoTimeout bounds a Do call whose context has no deadline.
const defaultDoTimeout = 5 * time.Second

// RedisError is an error reply ("-ERR ...", "-LOADING ...") from a Redis
// server, as returned by [Redis.Do]. Its text is the reply without the '-'.
type RedisError string

// Error returns the reply text.
func (e RedisError) Error() string { return string(e) }

// respDo sends one command to addr over a fresh connection and returns the
// decoded reply: string for simple and bulk strings, int64 for integers, nil
// for null replies, []any for arrays (nested error replies appear as
// RedisError values) and a RedisError as the error for a top-level error
// reply. The connection is bounded by ctx and, if ctx has no deadline, by
// defaultDoTimeout.
func respDo(ctx context.Context, addr string, args ...string) (any, error) {
	if len(args) == 0 {
		return nil, errors.New("testserver: empty Redis command")
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(defaultDoTimeout)
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

	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(c, b.String()); err != nil {
		return nil, ctxErr(ctx, err)
	}
	v, err := readReply(bufio.NewReader(c))
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	if e, ok := v.(RedisError); ok {
		return nil, e
	}
	return v, nil
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}

func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("testserver: malformed RESP line %q", line)
	}
	kind, body := line[0], line[1:len(line)-2]
	switch kind {
	case '+':
		return body, nil
	case '-':
		return RedisError(body), nil
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := respLen(body, "bulk")
		if n < 0 {
			return nil, err // a null bulk string, or a bad length
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := respLen(body, "array")
		if n < 0 {
			return nil, err // a null array, or a bad length
		}
		arr := make([]any, n)
		for i := range arr {
			if arr[i], err = readReply(r); err != nil {
				return nil, err
			}
		}
		return arr, nil
	}
	return nil, fmt.Errorf("testserver: unsupported RESP type %q", kind)
}

// respLen parses the length of a bulk string or array (kind names it in
// errors). A negative length (null) or an error returns -1.
func respLen(body, kind string) (int, error) {
	n, err := strconv.Atoi(body)
	if err != nil {
		return -1, fmt.Errorf("testserver: bad %s length %q", kind, body)
	}
	return max(n, -1), nil
}

// respDoer is a server that answers RESP commands: a Redis or a NetRedis.
type respDoer interface {
	Do(ctx context.Context, args ...string) (any, error)
}

// infoText sends the INFO-like command args to n, bounded by a second, and
// returns its reply as text ("" if the reply is not a string).
func infoText(n respDoer, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	v, err := n.Do(ctx, args...)
	if err != nil {
		return "", err
	}
	s, _ := v.(string)
	return s, nil
}

// infoField returns the value of field in an INFO reply, or "".
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), field+":"); ok {
			return v
		}
	}
	return ""
}

// respPing sends PING with a short timeout and wants PONG.
func respPing(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	v, err := respDo(ctx, addr, "PING")
	if err != nil {
		return err
	}
	if v != "PONG" {
		return fmt.Errorf("PING replied %v, want PONG", v)
	}
	return nil
}
