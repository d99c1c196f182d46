package zklock

import (
	"context"
	"errors"
	"fmt"

	"github.com/dlock-go/dlock"
	"github.com/go-zookeeper/zk"
)

// SetValue implements dlock.Proclaimer: it replaces the value kept in the
// data of the lock node of r's grant (token and fence), held through this
// Backend, with r.Value. It returns an error matching dlock.ErrNotHeld,
// and changes nothing, when r holds no lock here or its node is gone (the
// hold is then lost).
func (b *Backend) SetValue(ctx context.Context, r dlock.Request) error {
	if err := b.usable(); err != nil {
		return err
	}
	if r.Kind != dlock.KindLock {
		return fmt.Errorf("zklock: %q: a value goes with a lock, not with %s holds: %w", r.Key, r.Kind, dlock.ErrNotHeld)
	}
	h := b.lookup(r)
	if h == nil {
		return notHeld(r.Key)
	}
	// The node's name is unique to its acquisition: the write lands only
	// while that node exists.
	_, err := await(ctx, func() (*zk.Stat, error) { return b.conn.Set(h.path, encodeData(r.Token, r.Value), -1) })
	if errors.Is(err, zk.ErrNoNode) {
		err := h.goneErr()
		b.loseHold(h, err)
		return err
	}
	return zkErr("set value", r.Key, err)
}
