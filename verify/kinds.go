package verify

import (
	"context"
	"strconv"
	"strings"

	"github.com/dlock-go/dlock"
)

// The kinds of Config.Kind: what the workers take on the key.
const (
	// KindLock: every worker takes the key's lock (Client.Acquire).
	KindLock = "lock"
	// KindPermits, written "permits:N": every worker takes one permit of
	// an N-permit semaphore (Client.Semaphore).
	KindPermits = "permits"
	// KindRW: every worker takes a read-write lock (Client.RWLock), one
	// acquisition in writerEvery a write hold, the others read holds.
	KindRW = "rw"
	// KindElection: every worker campaigns for leadership
	// (Client.Election), leads for its critical section, then resigns.
	KindElection = "election"
)

// The roles of Event.Hold: what an acquisition of a kind other than
// KindLock took.
const (
	HoldPermit = "permit" // a semaphore permit
	HoldRead   = "read"   // a read-write lock's read hold
	HoldWrite  = "write"  // a read-write lock's write hold
	HoldLeader = "leader" // an election's leadership
)

// OpInspect is a worker's read of the server's view of the key
// (dlock.Inspector) while it holds a permit: Count is the number of holds
// the server listed, Value its number of permits.
const OpInspect = "inspect"

// writerEvery is the share of write holds under KindRW: one acquisition
// in writerEvery is a write hold.
const writerEvery = 4

// kindSpec is a parsed Config.Kind.
type kindSpec struct {
	name    string // KindLock, KindPermits, KindRW, KindElection
	permits int    // KindPermits: N
}

// String returns the kind as Config.Kind spells it ("permits:3").
func (k kindSpec) String() string {
	if k.name == KindPermits {
		return KindPermits + ":" + strconv.Itoa(k.permits)
	}
	return k.name
}

// parseKind validates Config.Kind; "" is KindLock.
func parseKind(s string) (kindSpec, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	switch s {
	case "", KindLock:
		return kindSpec{name: KindLock}, nil
	case KindRW, KindElection:
		return kindSpec{name: s}, nil
	}
	if n, ok := strings.CutPrefix(s, KindPermits+":"); ok {
		p, err := strconv.Atoi(n)
		if err != nil || p < 1 || p > 64 {
			return kindSpec{}, invalid("kind %q: the permit count must be a number in 1..64", s)
		}
		return kindSpec{name: KindPermits, permits: p}, nil
	}
	return kindSpec{}, invalid("unknown kind %q (known: %s, %s:N, %s, %s)", s, KindLock, KindPermits, KindRW, KindElection)
}

// kindState is a worker's handle on the primitive of its kind.
type kindState struct {
	spec  kindSpec
	sem   *dlock.Semaphore
	rw    *dlock.RWLock
	elect *dlock.Election
	n     int // acquisitions so far
}

// take acquires what the worker's kind takes on its key and returns the
// lease and its role (Event.Hold; "" for KindLock).
func (w *worker) take(ctx context.Context) (*dlock.Lease, string, error) {
	if w.spec.Kind == "" {
		l, err := w.client.Acquire(ctx, w.spec.Key, w.opts...)
		return l, "", err
	}
	if w.kind == nil {
		ks, err := parseKind(w.spec.Kind)
		if err != nil {
			return nil, "", err
		}
		w.kind = &kindState{spec: ks}
		switch ks.name {
		case KindPermits:
			w.kind.sem = w.client.Semaphore(w.spec.Key, ks.permits)
		case KindRW:
			w.kind.rw = w.client.RWLock(w.spec.Key)
		case KindElection:
			w.kind.elect = w.client.Election(w.spec.Key)
		}
	}
	k := w.kind
	k.n++
	switch k.spec.name {
	case KindPermits:
		l, err := k.sem.Acquire(ctx, w.opts...)
		return l, HoldPermit, err
	case KindRW:
		// Each worker starts at a different offset, so that writers
		// and readers mix from the start.
		if (k.n+w.spec.Worker)%writerEvery == 0 {
			l, err := k.rw.Lock(ctx, w.opts...)
			return l, HoldWrite, err
		}
		l, err := k.rw.RLock(ctx, w.opts...)
		return l, HoldRead, err
	case KindElection:
		l, err := k.elect.Campaign(ctx, w.spec.Proc, w.opts...)
		return l, HoldLeader, err
	}
	l, err := w.client.Acquire(ctx, w.spec.Key, w.opts...)
	return l, "", err
}

// kindCycle runs what a kind adds to a cycle after the grant of l, which
// the worker has logged: for a permit, the server's view (inspect); for a
// read hold, the whole cycle (readHold). It reports whether it ran the
// cycle, so that the read-modify-write is left out.
func (w *worker) kindCycle(ctx context.Context, l *dlock.Lease, phase string) bool {
	switch l.Kind() {
	case dlock.KindPermit:
		w.inspect(ctx, l)
	case dlock.KindRead:
		w.readHold(ctx, l, phase)
		return true
	}
	return false
}

// inspect logs the server's view of the key (OpInspect) right after a
// permit was granted, when the backend can tell it.
func (w *worker) inspect(ctx context.Context, l *dlock.Lease) {
	in, ok := w.client.Backend().(dlock.Inspector)
	if !ok {
		return
	}
	e := w.begin(OpInspect, w.spec.Key, l.Fence(), l.Owner(), "")
	ictx, cancel := context.WithTimeout(ctx, opTimeout)
	info, err := in.Inspect(ictx, w.spec.Key)
	cancel()
	if err != nil {
		w.end(e, OutcomeInfo, err)
		return
	}
	e.Count, e.Value = int64(len(info.Holds)), int64(info.Permits)
	w.end(e, OutcomeOK, nil)
}

// readHold is a reader's critical section: it holds its read hold as long
// as a writer's read-modify-write takes, touching no register, and
// releases it.
func (w *worker) readHold(ctx context.Context, l *dlock.Lease, phase string) {
	sleep(ctx, w.between(w.spec.TTL/workMinDiv, w.spec.TTL/workMaxDiv))
	w.release(ctx, l, phase)
	w.notify("rel")
	sleep(ctx, w.between(0, w.spec.TTL/thinkMaxDiv))
}

// kindLabel appends a kind other than KindLock to a report label.
func kindLabel(s, kind string) string {
	if kind == "" || kind == KindLock {
		return s
	}
	return s + " [" + kind + "]"
}

// validKind returns Config.Kind normalised for the workers: "" for the
// lock, else as parseKind spells it.
func validKind(s string) (string, error) {
	k, err := parseKind(s)
	if err != nil || k.name == KindLock {
		return "", err
	}
	return k.String(), nil
}

// permits returns N for a worker of kind "permits:N", else 0.
func (w *worker) permits() int64 {
	if w.kind == nil {
		return 0
	}
	return int64(w.kind.spec.permits)
}
