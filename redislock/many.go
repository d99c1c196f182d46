package redislock

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
)

// Groups implements dlock.MultiAcquirer: it splits sorted keys into the
// consecutive runs that TryAcquireAll can take in one script. On a Redis
// Cluster (a *redis.ClusterClient) these are the runs of keys whose locks
// live in the same hash slot (computed locally with CRC16, as Redis
// does); on any other client, all keys are one group. Keys are not
// validated here (TryAcquireAll does): an empty key gets a group of its
// own.
func (b *Backend) Groups(keys []string) [][]string {
	if len(keys) == 0 {
		return nil
	}
	if b.cluster == nil {
		return [][]string{append([]string(nil), keys...)}
	}
	var groups [][]string
	last := -1
	for _, k := range keys {
		s := -2
		if k != "" {
			s = Slot(b.lockName(k))
		}
		if s >= 0 && s == last {
			g := &groups[len(groups)-1]
			*g = append(*g, k)
			continue
		}
		groups = append(groups, []string{k})
		last = s
	}
	return groups
}

// TryAcquireAll implements dlock.MultiAcquirer: one attempt to take every
// request's lock in ONE script (acquire_all.lua), all or nothing, each
// with its own fence. When some lock is held by another token (or
// reserved for a FIFO waiter, who comes first), nothing is taken: every
// grant has OK false, those that stood in the way with HolderTTL set.
// Locks held by the request's own token are re-entered (reentrant) or
// granted again, as in TryAcquire.
//
// The requests must be valid and name distinct keys, else the error
// matches dlock.ErrInvalidKey (or what check reports); on a Redis Cluster
// their locks must share one hash slot (use Groups), else the error
// matches dlock.ErrInvalidKey. With WithReplicas, grants that too few
// replicas acknowledged are released again and the error matches
// ErrNotReplicated.
func (b *Backend) TryAcquireAll(ctx context.Context, rs []dlock.Request) ([]dlock.Grant, error) {
	if len(rs) == 0 {
		return nil, fmt.Errorf("redislock: acquire all: %w: no requests", dlock.ErrInvalidKey)
	}
	seen := make(map[string]bool, len(rs))
	keys := make([]string, 0, len(rs))
	args := make([]any, 0, 3*len(rs))
	slot := -1
	for i := range rs {
		r := &rs[i]
		if err := b.check(ctx, r, true); err != nil {
			return nil, err
		}
		if seen[r.Key] {
			return nil, fmt.Errorf("redislock: acquire all: %w: key %q given twice", dlock.ErrInvalidKey, r.Key)
		}
		seen[r.Key] = true
		lock := b.lockName(r.Key)
		if b.cluster != nil {
			s := Slot(lock)
			if slot >= 0 && s != slot {
				return nil, fmt.Errorf("redislock: acquire all: %w: keys %q and %q are in different Redis Cluster slots (%d, %d); split them with Groups",
					dlock.ErrInvalidKey, rs[0].Key, r.Key, slot, s)
			}
			slot = s
		}
		keys = append(keys, lock)
		args = append(args, r.Token, ttlArg(r.TTL), reentrantArg(r.Reentrant))
	}
	name := rs[0].Key
	if len(rs) > 1 {
		name = fmt.Sprint(len(rs), " keys from ", rs[0].Key)
	}
	run := func(ctx context.Context) (reply, error) {
		return b.eval(ctx, acquireAllScript, keys, args...)
	}
	releaseAll := func(gs []dlock.Grant) {
		for i, g := range gs {
			if g.OK {
				b.releaseGrant(ctx, rs[i], g.Fence)
			}
		}
	}
	late := func(v reply, err error) {
		if gs, gerr := parseGrants(v.v, err, len(rs)); gerr == nil {
			releaseAll(gs)
		}
	}
	v, err := guard(b, ctx, direct, run, late)
	if err != nil {
		return nil, b.callErr("acquire", name, err)
	}
	gs, err := parseGrants(v.v, nil, len(rs))
	if err != nil {
		return nil, err
	}
	if gs[0].OK {
		if err := b.replicated("acquire", name, v); err != nil {
			releaseAll(gs)
			return nil, err
		}
	}
	return gs, nil
}

// parseGrants reads acquire_all.lua's reply for n requests.
func parseGrants(v any, err error, n int) ([]dlock.Grant, error) {
	if err != nil {
		return nil, err
	}
	a, ok := v.([]any)
	if !ok || len(a) == 0 {
		return nil, unexpected("acquire all", v)
	}
	gs := make([]dlock.Grant, n)
	switch a[0] {
	case int64(codeGranted):
		if len(a) != 1+2*n {
			break
		}
		for i := range gs {
			fence, ok1 := a[1+2*i].(int64)
			count, ok2 := a[2+2*i].(int64)
			if !ok1 || !ok2 || fence <= 0 {
				return nil, unexpected("acquire all", v)
			}
			gs[i] = dlock.Grant{OK: true, Fence: uint64(fence), Count: int(count)}
		}
		return gs, nil
	case int64(codeHeld):
		if len(a) != 1+n {
			break
		}
		for i := range gs {
			pttl, ok := a[1+i].(int64)
			if !ok {
				return nil, unexpected("acquire all", v)
			}
			if pttl >= 0 {
				gs[i].HolderTTL = time.Duration(max(pttl, 1)) * time.Millisecond
			}
		}
		return gs, nil
	case int64(codeWrongType):
		return nil, wrongType(a, false)
	}
	return nil, unexpected("acquire all", v)
}

// Slot returns the Redis Cluster hash slot of a Redis key, as Redis
// computes it: CRC16 (XMODEM) modulo 16384 of the key's hash tag (the
// text between the first '{' and the first '}' after it, when not empty),
// else of the whole key. Slot(b.LockName(key)) is the slot of a lock.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) & 16383)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the
// checksum Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
