package zklock

import (
	"context"
	"errors"
	"fmt"

	"github.com/dlock-go/dlock"
	"github.com/go-zookeeper/zk"
)

// Inspect implements dlock.Inspector: the holder is the first node of the
// key's queue, its data is the owner token and its czxid the fence.
// Info.TTL is 0 (a holder lasts as long as its session), Info.Count is the
// reentrant count when this Backend is the holder and 0 (unknown)
// otherwise, and Info.Waiters is the number of nodes queued behind the
// holder.
func (b *Backend) Inspect(ctx context.Context, key string) (dlock.Info, error) {
	if err := b.usable(); err != nil {
		return dlock.Info{}, err
	}
	if err := dlock.ValidateKey(key); err != nil {
		return dlock.Info{}, fmt.Errorf("zklock: %w", err)
	}
	info, _, err := b.inspect(ctx, key)
	return info, zkErr("inspect", key, err)
}

// inspect returns key's Info and the holder's node path ("" when free).
func (b *Backend) inspect(ctx context.Context, key string) (dlock.Info, string, error) {
	keyPath := b.KeyPath(key)
	for attempt := 0; ; attempt++ {
		info := dlock.Info{Key: key}
		children, err := await(ctx, func() ([]string, error) {
			c, _, err := b.conn.Children(keyPath)
			return c, err
		})
		switch {
		case errors.Is(err, zk.ErrNoNode):
			return info, "", nil
		case err != nil:
			return info, "", err
		}
		q := parseQueue(children)
		if len(q) == 0 {
			return info, "", nil
		}
		path := keyPath + "/" + q[0].name
		type got struct {
			data []byte
			stat *zk.Stat
		}
		g, err := await(ctx, func() (got, error) {
			data, st, err := b.conn.Get(path)
			return got{data, st}, err
		})
		if errors.Is(err, zk.ErrNoNode) && attempt < 3 {
			continue // released meanwhile: look again
		}
		if err != nil {
			return info, "", err
		}
		info.Held = true
		info.Owner = string(g.data)
		info.Fence = uint64(g.stat.Czxid)
		info.Waiters = len(q) - 1
		b.mu.Lock()
		if h := b.holds[holdKey{key, info.Owner}]; h != nil && h.path == path {
			info.Count = h.count
		}
		b.mu.Unlock()
		return info, path, nil
	}
}

// ForceRelease implements dlock.ForceReleaser: it deletes the holder's
// node, whichever session owns it, and returns what it removed. The
// holder learns of the loss at once from its watch on the node (or at its
// next Refresh), and the next waiter in the queue is granted the lock.
func (b *Backend) ForceRelease(ctx context.Context, key string) (dlock.Info, error) {
	if err := b.usable(); err != nil {
		return dlock.Info{}, err
	}
	if err := dlock.ValidateKey(key); err != nil {
		return dlock.Info{}, fmt.Errorf("zklock: %w", err)
	}
	info, path, err := b.inspect(ctx, key)
	if err != nil || !info.Held {
		return info, zkErr("force-release", key, err)
	}
	err = b.delete(ctx, path)
	if errors.Is(err, zk.ErrNoNode) {
		// Released by its holder in the meantime: nothing was removed.
		return dlock.Info{Key: key}, nil
	}
	return info, zkErr("force-release", key, err)
}
