package testserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/resp"
)

// defaultDoTimeout bounds a Do call whose context has no deadline.
const defaultDoTimeout = 5 * time.Second

// RedisError is an error reply ("-ERR ...", "-LOADING ...") from a Redis
// server, as returned by [Redis.Do]. Its text is the reply without the '-'.
type RedisError = resp.Error

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
	return resp.Do(ctx, addr, defaultDoTimeout, args...)
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
