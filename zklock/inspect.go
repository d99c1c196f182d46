package zklock

import (
	"context"
	"errors"
	"sync"

	"github.com/dlock-go/dlock"
	"github.com/go-zookeeper/zk"
)

// Inspect implements dlock.Inspector. A lock's holder is the first node
// of the key's queue: its data is the owner token (and an elected
// leader's value), its czxid the fence; Info.Count is the reentrant count
// when this Backend is the holder and 0 (unknown) otherwise. The holders
// of permits or read holds are listed in Info.Holds (see the package
// documentation, Kinds of holds). TTLs are 0 (a holder lasts as long as
// its session) and Info.Waiters is the number of nodes queued behind the
// holders.
func (b *Backend) Inspect(ctx context.Context, key string) (dlock.Info, error) {
	if err := b.usableFor(key); err != nil {
		return dlock.Info{}, err
	}
	info, _, err := b.inspect(ctx, key)
	return info, zkErr("inspect", key, err)
}

// inspect returns key's Info and the paths of the holders' nodes (none
// when free).
func (b *Backend) inspect(ctx context.Context, key string) (dlock.Info, []string, error) {
	keyPath := b.KeyPath(key)
	for attempt := 0; ; attempt++ {
		info := dlock.Info{Key: key}
		children, err := await(ctx, func() ([]string, error) {
			c, _, err := b.conn.Children(keyPath)
			return c, err
		})
		switch {
		case errors.Is(err, zk.ErrNoNode):
			return info, nil, nil
		case err != nil:
			return info, nil, err
		}
		q := parseQueue(children)
		if len(q) == 0 {
			return info, nil, nil
		}
		holders := holdersOf(q)
		paths := make([]string, len(holders))
		for i, n := range holders {
			paths[i] = keyPath + "/" + n.name
		}
		got, err := b.readNodes(ctx, paths)
		if err != nil {
			return info, nil, err
		}
		info.Kind, info.Permits = nodeKind(q[0].name)
		info.Waiters = len(q) - len(holders)
		var live []string
		for i, g := range got {
			if g.stat == nil {
				continue // released meanwhile
			}
			live = append(live, paths[i])
			token, value := decodeData(g.data)
			if info.Kind == dlock.KindLock {
				info.Owner, info.Value, info.Fence = token, value, uint64(g.stat.Czxid)
				b.mu.Lock()
				if h := b.holds[holdKey{key, token}]; h != nil && h.path == paths[i] {
					info.Count = h.count
				}
				b.mu.Unlock()
				continue
			}
			info.Holds = append(info.Holds, dlock.Hold{Owner: token, Fence: uint64(g.stat.Czxid)})
		}
		if len(live) == 0 && attempt < 3 {
			continue // released meanwhile: look again
		}
		info.Held = len(live) > 0
		if !info.Held {
			info.Kind, info.Permits = dlock.KindLock, 0
		}
		return info, live, nil
	}
}

// holdersOf returns the nodes of q (in sequence order) that hold: the
// first node when it is a lock's; the read nodes ahead of the first
// writer; the first N permit nodes of a semaphore of N permits.
func holdersOf(q queue) queue {
	k, permits := nodeKind(q[0].name)
	if k == dlock.KindLock {
		return q[:1]
	}
	n := 0
	for n < len(q) {
		if nk, np := nodeKind(q[n].name); nk != k || np != permits || (k == dlock.KindPermit && n == permits) {
			break
		}
		n++
	}
	return q[:n]
}

// nodeData is a node's data and Stat (nil when the node does not exist).
type nodeData struct {
	data []byte
	stat *zk.Stat
}

// readNodes reads the nodes at paths, pipelined.
func (b *Backend) readNodes(ctx context.Context, paths []string) ([]nodeData, error) {
	out := make([]nodeData, len(paths))
	errs := make([]error, len(paths))
	var wg sync.WaitGroup
	for i, p := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = await(ctx, func() (nodeData, error) {
				data, st, err := b.conn.Get(p)
				return nodeData{data, st}, err
			})
			if errors.Is(errs[i], zk.ErrNoNode) {
				out[i], errs[i] = nodeData{}, nil
			}
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// ForceRelease implements dlock.ForceReleaser: it deletes the holders'
// nodes (the lock's, or every permit or read hold), whichever session
// owns them, and returns what it removed. The holders learn of the loss
// at once from their watches on the nodes (or at their next Refresh),
// and the next waiters in the queue are granted.
func (b *Backend) ForceRelease(ctx context.Context, key string) (dlock.Info, error) {
	if err := b.usableFor(key); err != nil {
		return dlock.Info{}, err
	}
	info, paths, err := b.inspect(ctx, key)
	if err != nil || !info.Held {
		return info, zkErr("force-release", key, err)
	}
	removed := 0
	var errs []error
	for _, p := range paths {
		switch err := b.delete(ctx, p); {
		case err == nil:
			removed++
		case !errors.Is(err, zk.ErrNoNode): // gone: released meanwhile
			errs = append(errs, err)
		}
	}
	if removed == 0 && len(errs) == 0 {
		return dlock.Info{Key: key}, nil // nothing was removed
	}
	return info, zkErr("force-release", key, errors.Join(errs...))
}
