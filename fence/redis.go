package fence

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
)

// The scripts: order.lua (the rule and the value shape) followed by
// set.lua or claim.lua.
var (
	//go:embed order.lua
	orderLua string
	//go:embed set.lua
	setLua string
	//go:embed claim.lua
	claimLua string

	setScript   = redis.NewScript(orderLua + setLua)
	claimScript = redis.NewScript(orderLua + claimLua)
)

// Redis stores fenced values in Redis: each value is a hash holding the
// value, the highest token accepted (fence f, epoch e; no e is epoch 0)
// and its owner, updated by one script so the check and the write are
// atomic on the server. Set and Claim refuse, with an error matching
// dlock.ErrWrongType, a key holding anything else.
type Redis struct {
	rdb RedisClient
}

// RedisClient is the part of a go-redis v9 client the store uses;
// *redis.Client, *redis.ClusterClient and redis.UniversalClient satisfy it.
type RedisClient interface {
	redis.Scripter
	HMGet(ctx context.Context, key string, fields ...string) *redis.SliceCmd
}

// NewRedis returns a fenced store on rdb.
func NewRedis(rdb RedisClient) *Redis { return &Redis{rdb: rdb} }

// Set writes value under key if fence by owner is accepted (see the
// package rule); otherwise it returns a *StaleError and writes nothing.
// A key holding something other than a fenced value (another type, or a
// hash with other fields) is an error matching dlock.ErrWrongType, and is
// left unchanged. It is SetToken with epoch 0.
func (r *Redis) Set(ctx context.Context, key, value string, fence uint64, owner string) error {
	return r.SetToken(ctx, key, value, Token{Fence: fence}, owner)
}

// SetToken writes value under key if tok by owner is accepted: newer than
// the highest token stored, or equal to it from the same owner. Otherwise
// it returns a *StaleError, or for a key that is not a fenced value an
// error matching dlock.ErrWrongType, and writes nothing. Epochs and fences
// compare exactly over the whole uint64 range.
func (r *Redis) SetToken(ctx context.Context, key, value string, tok Token, owner string) error {
	if err := r.check("set", key); err != nil {
		return err
	}
	res, err := setScript.Run(ctx, r.rdb, []string{key}, value, strconv.FormatUint(tok.Fence, 10), owner,
		strconv.FormatUint(tok.Epoch, 10)).Slice()
	if err != nil {
		return fmt.Errorf("dlock: fence: set %q: %w", key, err)
	}
	if err := wrongTypeReply("set", key, res); err != nil {
		return err
	}
	if len(res) != 3 {
		return fmt.Errorf("dlock: fence: set %q: unexpected reply %v", key, res)
	}
	if ok, _ := res[0].(int64); ok == 1 {
		return nil
	}
	return staleReply("set", key, tok, res[1], res[2])
}

// wrongTypeError reports a key that holds something other than a fenced
// value. It matches dlock.ErrWrongType.
type wrongTypeError struct {
	op, key string
	held    string // "list", "hash of other fields", ...
}

func (e *wrongTypeError) Error() string {
	msg := fmt.Sprintf("dlock: fence: %s %q: the key holds a %s, not a fenced value", e.op, e.key, e.held)
	if e.op != "get" {
		msg += "; nothing was changed"
	}
	return msg
}

func (e *wrongTypeError) Is(target error) bool { return target == dlock.ErrWrongType }

// wrongTypeReply returns the error of a script's {-1, what the key holds}
// reply, nil for any other reply.
func wrongTypeReply(op, key string, res []any) error {
	if len(res) != 2 || res[0] != int64(-1) {
		return nil
	}
	held, _ := res[1].(string)
	if held == "" {
		held = "value of another type"
	}
	return &wrongTypeError{op: op, key: key, held: held}
}

// staleReply returns the *StaleError of a rejected tok, the highest
// token's fence and epoch being the script's decimal strings hf and he.
func staleReply(op, key string, tok Token, hf, he any) error {
	hs, _ := hf.(string)
	es, _ := he.(string)
	highest, err1 := strconv.ParseUint(hs, 10, 64)
	hepoch, err2 := strconv.ParseUint(es, 10, 64)
	if err1 != nil || err2 != nil {
		return fmt.Errorf("dlock: fence: %s %q: malformed highest token %v, %v", op, key, hf, he)
	}
	return &StaleError{Resource: key, Fence: tok.Fence, Highest: highest, Epoch: tok.Epoch, HighestEpoch: hepoch}
}

// isNil reports whether rdb is nil or a nil pointer.
func isNil(rdb RedisClient) bool {
	if rdb == nil {
		return true
	}
	v := reflect.ValueOf(rdb)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// check returns an error when r has no client (a nil Redis, or
// NewRedis(nil)).
func (r *Redis) check(op, key string) error {
	if r == nil || isNil(r.rdb) {
		return fmt.Errorf("dlock: fence: %s %q: no Redis client (a nil Redis, or NewRedis(nil))", op, key)
	}
	return nil
}

// Get returns the value and the fence of the highest accepted token under
// key; a missing key returns "", 0 and no error. It is GetToken without
// the epoch.
func (r *Redis) Get(ctx context.Context, key string) (value string, fence uint64, err error) {
	value, tok, err := r.GetToken(ctx, key)
	return value, tok.Fence, err
}

// GetToken returns the value and the highest accepted token under key; a
// missing key returns "", the zero Token and no error. A key of another
// type, or a hash with some of the store's fields but no fence, is an
// error matching dlock.ErrWrongType; GetToken reads only those fields, so a
// hash holding none of them reads as missing. A key claimed but never set
// returns "" and the claim's token.
func (r *Redis) GetToken(ctx context.Context, key string) (string, Token, error) {
	if err := r.check("get", key); err != nil {
		return "", Token{}, err
	}
	vals, err := r.rdb.HMGet(ctx, key, "v", "f", "e", "o").Result()
	if errors.Is(err, redis.Nil) {
		return "", Token{}, nil
	}
	if err != nil {
		if strings.HasPrefix(err.Error(), "WRONGTYPE") {
			return "", Token{}, &wrongTypeError{op: "get", key: key, held: "value of another type"}
		}
		return "", Token{}, fmt.Errorf("dlock: fence: get %q: %w", key, err)
	}
	if vals[1] == nil { // no fence: not a value of this store
		if vals[0] != nil || vals[2] != nil || vals[3] != nil {
			return "", Token{}, &wrongTypeError{op: "get", key: key, held: "hash of other fields"}
		}
		return "", Token{}, nil
	}
	value, _ := vals[0].(string)
	var tok Token
	fs, _ := vals[1].(string)
	if tok.Fence, err = strconv.ParseUint(fs, 10, 64); err != nil {
		return "", Token{}, fmt.Errorf("dlock: fence: get %q: malformed fence %q", key, fs)
	}
	if es, ok := vals[2].(string); ok {
		if tok.Epoch, err = strconv.ParseUint(es, 10, 64); err != nil {
			return "", Token{}, fmt.Errorf("dlock: fence: get %q: malformed epoch %q", key, es)
		}
	}
	return value, tok, nil
}

// Claim reads the value under key and, in the same atomic step, records
// fence by owner as the highest accepted (the package rule applies), so
// that a holder with an older fence can no longer Set it. Use it for the
// read of a read-modify-write: a fence checked only on the write does not
// protect one, because the old holder could write between the new
// holder's read and its write. A rejected claim returns a *StaleError and
// changes nothing; a missing key reads as "". A key that is not a fenced
// value is an error matching dlock.ErrWrongType, as in Set. It is
// ClaimToken with epoch 0.
func (r *Redis) Claim(ctx context.Context, key string, fence uint64, owner string) (string, error) {
	return r.ClaimToken(ctx, key, Token{Fence: fence}, owner)
}

// ClaimToken is Claim for a token: it reads the value under key and
// records tok by owner as the highest accepted, if SetToken would accept
// it; otherwise it returns SetToken's error and changes nothing.
func (r *Redis) ClaimToken(ctx context.Context, key string, tok Token, owner string) (string, error) {
	if err := r.check("claim", key); err != nil {
		return "", err
	}
	res, err := claimScript.Run(ctx, r.rdb, []string{key}, strconv.FormatUint(tok.Fence, 10), owner,
		strconv.FormatUint(tok.Epoch, 10)).Slice()
	if err != nil {
		return "", fmt.Errorf("dlock: fence: claim %q: %w", key, err)
	}
	if len(res) == 0 {
		return "", fmt.Errorf("dlock: fence: claim %q: empty reply", key)
	}
	if err := wrongTypeReply("claim", key, res); err != nil {
		return "", err
	}
	if ok, _ := res[0].(int64); ok == 1 && len(res) == 2 {
		v, _ := res[1].(string)
		return v, nil
	}
	if len(res) != 3 {
		return "", fmt.Errorf("dlock: fence: claim %q: unexpected reply %v", key, res)
	}
	return "", staleReply("claim", key, tok, res[1], res[2])
}
