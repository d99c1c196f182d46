package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock-go/dlock"
)

// holdKind is what a running command holds on its key.
type holdKind int

const (
	holdLock   holdKind = iota // the key's lock (a read-write lock's write hold): dlock run
	holdPermit                 // one of a semaphore's permits: dlock run --permits N
	holdRead                   // a read-write lock's read hold: dlock run --shared
	holdLeader                 // the election's leadership: dlock leader run
)

// kind returns what the flags ask the command to hold.
func (f *runFlags) kind() holdKind {
	switch {
	case f.leader:
		return holdLeader
	case f.permitsSet:
		return holdPermit
	case f.shared:
		return holdRead
	}
	return holdLock
}

// cmdName returns the command's name for messages: "run" or "leader run".
func (f *runFlags) cmdName() string {
	if f.leader {
		return "leader run"
	}
	return "run"
}

// addKindFlags registers --permits and --shared on run.
func (f *runFlags) addKindFlags(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.IntVar(&f.permits, "permits", 0, "hold one of N permits of the semaphore KEY instead of its lock: at most N commands run at once (every holder of KEY must give the same N)")
	fl.BoolVar(&f.shared, "shared", false, "hold a read (shared) hold of the read-write lock KEY: shared runs overlap one another, never a plain run of KEY")
	prev := cmd.PreRunE
	cmd.PreRunE = func(cmd *cobra.Command, args []string) error {
		f.permitsSet = cmd.Flags().Changed("permits")
		if prev != nil {
			return prev(cmd, args)
		}
		return nil
	}
}

// validateKind checks the flags that choose the kind of hold.
func (f *runFlags) validateKind() error {
	switch {
	case f.permitsSet && f.shared:
		return usageErrorf("run: give at most one of --permits and --shared")
	case f.permitsSet && f.permits < 1:
		return usageErrorf("invalid --permits %d: must be at least 1", f.permits)
	case f.permitsSet && f.owner != "":
		return usageErrorf("run: --owner cannot be used with --permits: permits are not reentrant")
	case f.shared && f.owner != "":
		return usageErrorf("run: --owner cannot be used with --shared: read holds are not reentrant")
	}
	return nil
}

// take makes the Client call that acquires what the flags ask for:
// exactly one attempt when once is set, else a wait as ctx and the wait
// strategy allow.
func (f *runFlags) take(ctx context.Context, c *dlock.Client, key string, once bool, opts []dlock.Option) (*dlock.Lease, error) {
	switch f.kind() {
	case holdPermit:
		s := c.Semaphore(key, f.permits)
		if once {
			return s.TryAcquire(ctx, opts...)
		}
		return s.Acquire(ctx, opts...)
	case holdRead:
		rw := c.RWLock(key)
		if once {
			return rw.TryRLock(ctx, opts...)
		}
		return rw.RLock(ctx, opts...)
	case holdLeader:
		if once {
			opts = append(opts, dlock.WithWait(dlock.NoWait()))
		}
		return c.Election(key).Campaign(ctx, f.value, opts...)
	}
	if once {
		return c.TryAcquire(ctx, key, opts...)
	}
	return c.Acquire(ctx, key, opts...)
}

// busy says why the hold is not granted now, for the conflict and wait
// messages.
func (f *runFlags) busy(key string) string {
	switch f.kind() {
	case holdPermit:
		return fmt.Sprintf("all %d permits of %q are held", f.permits, key)
	case holdRead:
		return fmt.Sprintf("lock %q is held by a writer, or a writer waits for it", key)
	case holdLeader:
		return fmt.Sprintf("election %q has another leader", key)
	}
	return fmt.Sprintf("lock %q is held by another owner", key)
}

// kindWords are the words of each kind of hold in messages: held names
// the hold on a key (a format of the key), until says what a wait without
// end waits for, feature what the hold needs from the backend.
var kindWords = [...]struct{ held, until, feature string }{
	holdLock:   {"the lock %q", "until it is free", "locks"},
	holdPermit: {"the permit of %q", "until a permit is free", "semaphores (--permits)"},
	holdRead:   {"the read hold of %q", "until it is free", "read-write locks (--shared)"},
	holdLeader: {"the leadership of %q", "until elected", "leader election"},
}

// until says what a wait without end waits for, for the wait notice.
func (f *runFlags) until() string { return kindWords[f.kind()].until }

// held names the hold on key, for messages: "the lock "K"", "the permit
// of "K"", ...
func (f *runFlags) held(key string) string { return fmt.Sprintf(kindWords[f.kind()].held, key) }

// env returns the variables the command gets beyond DLOCK_KEY,
// DLOCK_FENCE, DLOCK_OWNER and DLOCK_BACKEND: DLOCK_TERM for a leader,
// DLOCK_PERMITS for a permit holder.
func (f *runFlags) env(lease *dlock.Lease) []string {
	switch f.kind() {
	case holdLeader:
		return []string{"DLOCK_TERM=" + strconv.FormatUint(lease.Fence(), 10)}
	case holdPermit:
		return []string{"DLOCK_PERMITS=" + strconv.Itoa(f.permits)}
	}
	return nil
}

// kindError turns an acquisition error that is about the kind of hold
// (a backend without it, a semaphore whose holders use another number of
// permits) into a usage error, or returns nil.
func (f *runFlags) kindError(kind, key string, err error) error {
	switch {
	case errors.Is(err, errors.ErrUnsupported):
		return usageErrorf("%s: the %s backend does not support %s (%s)", f.cmdName(), kind, f.feature(), trim(err))
	case errors.Is(err, dlock.ErrPermits):
		return usageErrorf("%s: --permits %d disagrees with the holders of %q (%s)", f.cmdName(), f.permits, key, trim(err))
	}
	return nil
}

// feature names what the flags need from the backend.
func (f *runFlags) feature() string { return kindWords[f.kind()].feature }

// describeHolds describes the permit or read holds of info, for the
// conflict message of run: "2 of 2 permits held: owner A (fence 5), ...".
func describeHolds(info dlock.Info) string {
	var b strings.Builder
	switch info.Kind {
	case dlock.KindPermit:
		fmt.Fprintf(&b, "%d of %d permits held", len(info.Holds), info.Permits)
	case dlock.KindRead:
		fmt.Fprintf(&b, "%d read hold", len(info.Holds))
		if len(info.Holds) != 1 {
			b.WriteByte('s')
		}
		if info.Waiters > 0 {
			fmt.Fprintf(&b, ", %d waiting", info.Waiters)
		}
	}
	for i, h := range info.Holds {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "owner %s (fence %d)", h.Owner, h.Fence)
	}
	return b.String()
}

// holdJSON is one permit or read hold in inspect --json.
type holdJSON struct {
	Owner string `json:"owner"`
	Fence uint64 `json:"fence"`
	TTL   string `json:"ttl,omitempty"`    // remaining lifetime, e.g. "29.512s"
	TTLms int64  `json:"ttl_ms,omitempty"` // the same in milliseconds
}

// holdsJSON converts the holds of info.
func holdsJSON(info dlock.Info) []holdJSON {
	var hs []holdJSON
	for _, h := range info.Holds {
		j := holdJSON{Owner: h.Owner, Fence: h.Fence}
		if h.TTL > 0 {
			j.TTL = h.TTL.Round(time.Millisecond).String()
			j.TTLms = h.TTL.Milliseconds()
		}
		hs = append(hs, j)
	}
	return hs
}

// ttlText formats a remaining lifetime, "unknown" when 0.
func ttlText(d time.Duration) string {
	if d <= 0 {
		return "unknown"
	}
	return d.Round(time.Millisecond).String()
}

// writeHolds prints the permit or read holds of info as "name value"
// lines on tw: kind, permits, the number of holds and one line per hold.
func writeHolds(tw io.Writer, info dlock.Info) {
	fmt.Fprintf(tw, "held\tyes\n")
	fmt.Fprintf(tw, "kind\t%s\n", info.Kind)
	if info.Kind == dlock.KindPermit {
		fmt.Fprintf(tw, "permits\t%d\n", info.Permits)
	}
	fmt.Fprintf(tw, "holds\t%d\n", len(info.Holds))
	for _, h := range info.Holds {
		fmt.Fprintf(tw, "hold\towner %s, fence %d, ttl %s\n", h.Owner, h.Fence, ttlText(h.TTL))
	}
}

// releaseHold implements `release --owner` for a key that holds permits
// or read holds (info, as inspected): it releases owner's hold, or exits
// with code 1 when owner has none.
func releaseHold(ctx context.Context, g *globals, c *conn, info dlock.Info, owner string, asJSON bool, out io.Writer) error {
	var mine *dlock.Hold
	for i := range info.Holds {
		if info.Holds[i].Owner == owner {
			mine = &info.Holds[i]
			break
		}
	}
	if mine == nil {
		return exitWith(exitFailure, fmt.Errorf("release: %q has no %s hold of owner %q: nothing released", info.Key, info.Kind, owner))
	}
	req := dlock.Request{Key: info.Key, Token: owner, TTL: dlock.DefaultTTL, Fence: mine.Fence, Kind: info.Kind, Permits: info.Permits}
	err := c.backend.Release(ctx, req)
	switch {
	case errors.Is(err, dlock.ErrNotHeld) && (c.kind == "etcd" || c.kind == "zk"):
		return exitWith(exitFailure, fmt.Errorf("release: the %s hold of %q was not released: the %s backend releases a hold only from the session that took it (stop the holder, or use --force)", info.Kind, info.Key, c.kind))
	case errors.Is(err, dlock.ErrNotHeld):
		return exitWith(exitFailure, fmt.Errorf("release: %q has no %s hold of owner %q: nothing released", info.Key, info.Kind, owner))
	case err != nil:
		return opError(c, g.timeout, err)
	}
	released := info
	released.Holds = []dlock.Hold{*mine}
	if asJSON {
		j := toJSON(c.kind, released)
		action := "released"
		j.Action = &action
		return writeJSON(out, j)
	}
	fmt.Fprintf(out, "released the %s hold of owner %s on %q (fence %d)\n", info.Kind, owner, info.Key, mine.Fence)
	return nil
}
