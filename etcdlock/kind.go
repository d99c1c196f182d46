package etcdlock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
)

var (
	_ dlock.KindSupporter = (*Backend)(nil)
	_ dlock.Proclaimer    = (*Backend)(nil)
)

// SupportsKind implements dlock.KindSupporter: semaphore permits
// (dlock.KindPermit) and read holds (dlock.KindRead), besides locks. See
// the package documentation, Permits and read holds.
func (b *Backend) SupportsKind(k dlock.Kind) bool {
	return k == dlock.KindLock || k == dlock.KindPermit || k == dlock.KindRead
}

// Entry names of permits and read holds, in the lock key's directory:
//
//	DIR + "~r." + ID + "." + SLOT       a read hold (or a queued reader)
//	DIR + "~p" + N + "." + ID + "." + SLOT  a permit of a semaphore of N
//
// A lock's entries (named after a token in hex, or ID.SLOT with ID in
// base32 upper case) all sort below "~", so the directory splits into
// three ranges a transaction can compare at once: [DIR, DIR+"~") the
// locks (a read-write lock's writers), DIR+"~r." the readers and DIR+"~p"
// the permits, with a sub-range per number of permits.

// kindNames is the entry names the Backend uses for permits and read
// holds, claimed per (key, token) like the slots of non-reentrant locks
// (which they are too, in nameSet.slots). Guarded by Backend.mu.
type kindNames struct {
	byRef  map[kindRef]kindName
	byName map[string]kindRef
}

type kindRef struct{ key, token string }

type kindName struct {
	name string
	kind dlock.Kind
}

// kindNameLocked returns the entry name of (key, token) if it is a permit
// or read hold the Backend queues for or holds. b.mu must be held.
func (b *Backend) kindNameLocked(key, token string) (string, bool) {
	if len(b.kinds.byRef) == 0 {
		return "", false
	}
	kn, ok := b.kinds.byRef[kindRef{key, token}]
	return kn.name, ok
}

// forgetKindLocked forgets the kind of the entry name, whose slot was
// freed. b.mu must be held.
func (b *Backend) forgetKindLocked(name string) {
	if len(b.kinds.byName) == 0 {
		return
	}
	if ref, ok := b.kinds.byName[name]; ok {
		delete(b.kinds.byName, name)
		delete(b.kinds.byRef, ref)
	}
}

// wrongKind reports whether r names a hold of another kind than r.Kind
// through b (a read hold released as a write, say): such a request
// changes nothing and gets dlock.ErrNotHeld.
func (b *Backend) wrongKind(r dlock.Request) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.wrongKindLocked(r)
}

// wrongKindLocked is wrongKind with b.mu held. A permit or read hold is
// known only to the Backend that granted it.
func (b *Backend) wrongKindLocked(r dlock.Request) bool {
	if len(b.kinds.byRef) == 0 {
		return r.Kind != dlock.KindLock
	}
	kn, ok := b.kinds.byRef[kindRef{r.Key, r.Token}]
	if !ok {
		return r.Kind != dlock.KindLock
	}
	return kn.kind != r.Kind
}

// kindSub returns the part of an entry name of r between the directory
// and the Backend's id.
func kindSub(r dlock.Request) string {
	if r.Kind == dlock.KindRead {
		return "~r."
	}
	return "~p" + strconv.Itoa(r.Permits) + "."
}

// kindOf returns the kind of the entry name in the directory dir, and
// the number of permits of a permit's entry.
func kindOf(dir, name string) (dlock.Kind, int) {
	rest := strings.TrimPrefix(name, dir)
	switch {
	case strings.HasPrefix(rest, "~r."):
		return dlock.KindRead, 0
	case strings.HasPrefix(rest, "~p"):
		i := strings.IndexByte(rest, '.')
		if i < 0 {
			return dlock.KindPermit, 0
		}
		n, _ := strconv.Atoi(rest[2:i])
		return dlock.KindPermit, n
	}
	return dlock.KindLock, 0
}

// claimKindName returns the entry name for a new permit or read hold of
// r: the smallest slot of its range the Backend does not use, which stays
// r's until unclaim (or, once granted, until the hold ends).
func (b *Backend) claimKindName(r dlock.Request) string {
	prefix := b.dir(r.Key) + kindSub(r) + b.id + "."
	ref := kindRef{r.Key, r.Token}
	b.mu.Lock()
	defer b.mu.Unlock()
	if kn, ok := b.kinds.byRef[ref]; ok {
		if s := b.names.slots[kn.name]; s != nil && s.token == r.Token {
			s.refs++ // the same token twice at once: the entry tells
			return kn.name
		}
	}
	if b.kinds.byRef == nil {
		b.kinds.byRef = make(map[kindRef]kindName)
		b.kinds.byName = make(map[string]kindRef)
	}
	for i := 0; ; i++ {
		name := prefix + strconv.Itoa(i)
		if b.names.slots[name] != nil || b.holds.byName[name] != nil {
			continue
		}
		if _, orphaned := b.orphans.byName[name]; orphaned {
			continue
		}
		b.names.slots[name] = &slot{token: r.Token, refs: 1}
		b.kinds.byRef[ref] = kindName{name: name, kind: r.Kind}
		b.kinds.byName[name] = ref
		return name
	}
}

// checkKind validates a permit or read request.
func checkKind(r dlock.Request) error {
	switch {
	case r.Kind != dlock.KindPermit && r.Kind != dlock.KindRead:
		return fmt.Errorf("etcdlock: unknown hold kind %v: %w", r.Kind, dlock.ErrInvalidOption)
	case r.Reentrant:
		return fmt.Errorf("etcdlock: %s holds are not reentrant: %w", r.Kind, dlock.ErrInvalidOption)
	case r.Kind == dlock.KindPermit && r.Permits < 1:
		return fmt.Errorf("etcdlock: a semaphore needs at least 1 permit, got %d: %w", r.Permits, dlock.ErrInvalidOption)
	}
	return nil
}

// kindTxn builds the transaction creating the entry name of r. It
// succeeds only if the name is free and the key holds nothing of another
// kind: a reader needs no permits (and, with try, no lock entry: no
// writer holds or waits); a permit needs no lock entry, no reader and no
// permit of a semaphore of another size. On success it also reads what
// decides the grant: for a wait, the entries that may keep it out (see
// kindWaiter.blockers); for a permit's try, the semaphore's number of
// entries. Otherwise it reads what made it fail (see kindRefusal).
func (b *Backend) kindTxn(ctx context.Context, r dlock.Request, name string, id clientv3.LeaseID, try bool) (*clientv3.TxnResponse, error) {
	dir, own := b.dir(r.Key), b.dir(r.Key)+kindSub(r)
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(name), "=", 0)}
	if r.Kind == dlock.KindRead && !try {
		// No permit; lock entries are waited for.
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(dir+"~p"), "=", 0).WithPrefix())
	} else {
		// Nothing in the directory outside the request's own range (two
		// range comparisons cost the server less than one per kind).
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(dir), "=", 0).WithRange(own),
			clientv3.Compare(clientv3.CreateRevision(clientv3.GetPrefixRangeEnd(own)), "=", 0).WithRange(clientv3.GetPrefixRangeEnd(dir)))
	}
	then := []clientv3.Op{clientv3.OpPut(name, encodeValue(1, r.Token), clientv3.WithLease(id))}
	switch {
	case r.Kind == dlock.KindRead && !try:
		// The newest lock entry: every one is ahead of ours.
		then = append(then, clientv3.OpGet(dir, clientv3.WithRange(dir+"~"), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend),
			clientv3.WithLimit(1), clientv3.WithKeysOnly()))
	case r.Kind == dlock.KindPermit && try:
		then = append(then, clientv3.OpGet(own, clientv3.WithPrefix(), clientv3.WithCountOnly()))
	case r.Kind == dlock.KindPermit:
		// Ours and up to Permits entries ahead of it, newest first.
		then = append(then, clientv3.OpGet(own, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend),
			clientv3.WithLimit(int64(r.Permits)+1), clientv3.WithKeysOnly()))
	}
	return b.cli.Txn(ctx).
		If(cmps...).
		Then(then...).
		Else(clientv3.OpGet(name),
			clientv3.OpGet(dir, clientv3.WithRange(dir+"~"), clientv3.WithLimit(1), clientv3.WithKeysOnly()),
			clientv3.OpGet(dir+"~r.", clientv3.WithPrefix(), clientv3.WithLimit(1), clientv3.WithKeysOnly()),
			clientv3.OpGet(dir+"~p", clientv3.WithPrefix(), clientv3.WithLimit(1), clientv3.WithKeysOnly())).
		Commit()
}

// kindRefusal explains a failed kindTxn: leftover is the entry found
// under r's name with another token (a leftover of an earlier use of the
// slot: the caller retires it and tries another name); else an error
// matching dlock.ErrNotAcquired (r.Token holds or waits already: a token
// used twice at once), dlock.ErrWrongType or dlock.ErrPermits; else (a
// reader's try while a writer holds or waits) nothing: not granted.
func (b *Backend) kindRefusal(r dlock.Request, resp *clientv3.TxnResponse) (leftover *mvccpb.KeyValue, err error) {
	if own := resp.Responses[0].GetResponseRange().Kvs; len(own) > 0 {
		if _, token, ok := decodeValue(own[0].Value); ok && token == r.Token {
			return nil, errTokenInUse(r.Key)
		}
		return own[0], nil
	}
	locks := len(resp.Responses[1].GetResponseRange().Kvs) > 0
	readers := len(resp.Responses[2].GetResponseRange().Kvs) > 0
	permits := resp.Responses[3].GetResponseRange().Kvs
	switch {
	case r.Kind == dlock.KindRead && len(permits) > 0:
		return nil, fmt.Errorf("etcdlock: lock %q holds a semaphore's permits, not read holds: %w", r.Key, dlock.ErrWrongType)
	case r.Kind == dlock.KindRead:
		return nil, nil
	case locks:
		return nil, fmt.Errorf("etcdlock: lock %q is held or queued for as a lock, not a semaphore: %w", r.Key, dlock.ErrWrongType)
	case readers:
		return nil, fmt.Errorf("etcdlock: lock %q holds read holds, not a semaphore's permits: %w", r.Key, dlock.ErrWrongType)
	case len(permits) > 0:
		_, n := kindOf(b.dir(r.Key), string(permits[0].Key))
		return nil, fmt.Errorf("etcdlock: semaphore %q: %w: its holders use %d permits, the request %d", r.Key, dlock.ErrPermits, n, r.Permits)
	}
	return nil, nil // all gone meanwhile: try again
}

// tryKind is TryAcquire of a permit or read hold: one transaction
// creating the entry if the rules of its kind let it be granted at once
// (kindTxn). A reader's never writes when it fails. A permit's counts the
// semaphore's entries as it creates its own, and deletes it (one more
// request) when more than Permits are ahead of it, holders or waiters, so
// it never overtakes a queued waiter either.
func (b *Backend) tryKind(ctx context.Context, r dlock.Request, sec int64, start time.Time) (dlock.Grant, error) {
	if err := checkKind(r); err != nil {
		return dlock.Grant{}, err
	}
	b.clearOrphans(ctx, b.dir(r.Key))
	name := b.claimKindName(r)
	for attempt := 1; ; attempt++ {
		g, next, retry, err := b.tryKindOnce(ctx, r, name, sec, start)
		name = next
		if retry && attempt < maxLeaseRetries {
			continue
		}
		if err != nil || !g.OK {
			b.unclaim(r, name)
		}
		return g, err
	}
}

// tryKindOnce is one attempt of tryKind with the entry name. It returns
// the name to use next (another one when name was found taken), and
// whether to retry (the lease was gone, or the name taken).
func (b *Backend) tryKindOnce(ctx context.Context, r dlock.Request, name string, sec int64, start time.Time) (g dlock.Grant, next string, retry bool, err error) {
	ls, err := b.lease(ctx, sec)
	if err != nil {
		return dlock.Grant{}, name, false, err
	}
	// As in tryOnce: the lock lives on the server at least TTL from start.
	life, reuse := b.lifeFrom(ls, start, r.TTL)
	wait := func() error { return nil }
	if !reuse {
		wait = b.startFresh(ctx, ls, start, r.TTL)
	}
	resp, err := b.kindTxn(ctx, r, name, ls.id, true)
	kaErr := wait()
	if isLeaseNotFound(err) {
		b.leaseGone(ls, fmt.Errorf("etcdlock: lease %x expired or was revoked: %w", int64(ls.id), dlock.ErrNotHeld))
		return dlock.Grant{}, name, true, fmt.Errorf("etcdlock: acquire %q: %w", r.Key, err)
	}
	if err != nil {
		b.dropCreated(ctx, name, ls, encodeValue(1, r.Token), 0)
		return dlock.Grant{}, name, false, fmt.Errorf("etcdlock: acquire %q: %w", r.Key, rpcErr(ctx, err))
	}
	if !resp.Succeeded {
		leftover, err := b.kindRefusal(r, resp)
		if leftover != nil {
			b.retireSlot(r, name, leftover.CreateRevision)
			return dlock.Grant{}, b.claimKindName(r), true, fmt.Errorf("etcdlock: acquire %q: entry names kept taken", r.Key)
		}
		return dlock.Grant{}, name, false, err
	}
	fence := resp.Header.Revision
	if r.Kind == dlock.KindPermit && resp.Responses[1].GetResponseRange().Count > int64(r.Permits) {
		b.abandon(ctx, r.Key, name, fence, false) // more than Permits ahead
		return dlock.Grant{}, name, false, nil
	}
	if kaErr != nil {
		b.abandon(ctx, r.Key, name, fence, false)
		return dlock.Grant{}, name, b.dead(ls), kaErr
	}
	b.addHold(name, r.Key, r.Token, fence, ls, 1, fence, fence+1)
	return dlock.Grant{OK: true, Fence: uint64(fence), Count: 1, TTL: life}, name, false, nil
}
