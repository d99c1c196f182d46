package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock-go/dlock"
)

// lockJSON is the JSON form of a lock's state (inspect --json, release --json).
type lockJSON struct {
	Key     string  `json:"key"`
	Held    bool    `json:"held"`
	Owner   string  `json:"owner,omitempty"`
	Fence   uint64  `json:"fence,omitempty"`
	TTL     string  `json:"ttl,omitempty"`    // remaining lifetime, e.g. "29.512s"
	TTLms   int64   `json:"ttl_ms,omitempty"` // the same in milliseconds
	Count   int     `json:"count,omitempty"`  // reentrant hold count
	Waiters *int    `json:"waiters"`          // null when the backend cannot tell
	Backend string  `json:"backend"`          // the URL scheme
	Action  *string `json:"action,omitempty"` // release: "released", "removed" or "none"

	Kind    string     `json:"kind"`              // "lock", or "permit" (a semaphore's holds) or "read" (read holds)
	Value   string     `json:"value,omitempty"`   // an elected leader's value
	Permits int        `json:"permits,omitempty"` // kind permit: the semaphore's number of permits
	Holds   []holdJSON `json:"holds,omitempty"`   // kind permit or read: each hold (owner and fence above are then empty)
}

func toJSON(kind string, info dlock.Info) lockJSON {
	j := lockJSON{Key: info.Key, Held: info.Held, Backend: kind, Kind: info.Kind.String()}
	if info.Held {
		j.Owner, j.Fence, j.Count = info.Owner, info.Fence, info.Count
		j.Value, j.Permits, j.Holds = info.Value, info.Permits, holdsJSON(info)
		if info.TTL > 0 {
			j.TTL = info.TTL.Round(time.Millisecond).String()
			j.TTLms = info.TTL.Milliseconds()
		}
	}
	if info.Waiters >= 0 {
		w := info.Waiters
		j.Waiters = &w
	}
	return j
}

// writeInfo prints a lock's state as aligned "name value" lines.
func writeInfo(w io.Writer, info dlock.Info) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "key\t%s\n", info.Key)
	if !info.Held {
		fmt.Fprintf(tw, "held\tno\n")
	} else if info.Kind != dlock.KindLock {
		writeHolds(tw, info)
	} else {
		fmt.Fprintf(tw, "held\tyes\n")
		fmt.Fprintf(tw, "owner\t%s\n", info.Owner)
		fmt.Fprintf(tw, "fence\t%d\n", info.Fence)
		if info.Value != "" {
			fmt.Fprintf(tw, "value\t%s\n", info.Value)
		}
		if info.TTL > 0 {
			fmt.Fprintf(tw, "ttl\t%v\n", info.TTL.Round(time.Millisecond))
		} else {
			fmt.Fprintf(tw, "ttl\tunknown\n")
		}
		if info.Count > 0 {
			fmt.Fprintf(tw, "count\t%d\n", info.Count)
		} else {
			fmt.Fprintf(tw, "count\tunknown\n")
		}
	}
	if info.Waiters >= 0 {
		fmt.Fprintf(tw, "waiters\t%d\n", info.Waiters)
	} else {
		fmt.Fprintf(tw, "waiters\tunknown\n")
	}
	_ = tw.Flush()
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func keyArg(name string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != 1 {
			return usageErrorf("%s: want exactly one KEY, got %d arguments", name, len(args))
		}
		if err := dlock.ValidateKey(args[0]); err != nil {
			return usageErrorf("%s: %s", name, trim(err))
		}
		return nil
	}
}

// opError turns a failed server operation into the error to exit with.
func opError(c *conn, timeout time.Duration, err error) error {
	if isConnError(err) {
		return unavailable(c.kind, c.where, timeout, err)
	}
	return exitWith(exitFailure, err)
}

func newInspectCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect KEY",
		Short: "Show who holds a lock",
		Long: `Show the state of the lock KEY as the server sees it: whether it is held, the holder's
owner token, fencing token, remaining TTL and reentrant hold count, and the number of
waiters queued on the server (where the backend keeps a queue). Exit code 0 whether or
not the lock is held; use --json in scripts.

When KEY is an election's, the holder is the leader and its proclaimed value is shown
too (value; the fence is its term). When KEY holds a semaphore's permits (dlock run
--permits) or read holds (dlock run --shared), the output says which (kind permit or
read), the semaphore's number of permits, and each hold's owner, fence and TTL (JSON:
"kind", "permits", "holds"; "owner" and "fence" are then empty).`,
		Example: `  dlock inspect report:nightly
  dlock inspect --json report:nightly | jq -r .owner
  dlock inspect --json payments:batch | jq '.holds | length'   # permits in use`,
		Args: keyArg("inspect"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withConn(cmd.Context(), func(octx context.Context, c *conn) error {
				in, ok := c.backend.(dlock.Inspector)
				if !ok {
					return exitWith(exitFailure, fmt.Errorf("inspect: the %s backend does not support inspect", c.kind))
				}
				info, err := in.Inspect(octx, args[0])
				if err != nil {
					return opError(c, g.timeout, err)
				}
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), toJSON(c.kind, info))
				}
				writeInfo(cmd.OutOrStdout(), info)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the state as a JSON object")
	return cmd
}

func newReleaseCmd(g *globals) *cobra.Command {
	var (
		owner  string
		force  bool
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "release KEY (--owner OWNER | --force)",
		Short: "Release a lock",
		Long: `Release the lock KEY.

--owner OWNER releases it only if OWNER holds it (all of OWNER's reentrant holds); if
another owner holds it, or nobody, nothing changes and dlock exits with code 1. This is
safe: it never removes someone else's lock.

--force removes the lock whoever holds it and prints what it removed. The holder is not
told at once: its next renewal finds the lock gone and it reports the lease lost (a
running ` + "`dlock run`" + ` then stops its command and exits with its --lost-exit-code).
Use it for locks whose holder is gone for good.`,
		Example: `  dlock release report:nightly --owner "$DLOCK_OWNER"
  dlock release report:nightly --force`,
		Args: keyArg("release"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if force == (owner != "") {
				return usageErrorf("release: give exactly one of --owner OWNER and --force")
			}
			return g.withConn(cmd.Context(), func(octx context.Context, c *conn) error {
				out := cmd.OutOrStdout()
				key := args[0]
				if force {
					return forceRelease(octx, g, c, key, asJSON, out)
				}
				return ownerRelease(octx, g, c, key, owner, asJSON, out)
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&owner, "owner", "", "release only if this owner token holds the lock")
	fl.BoolVar(&force, "force", false, "remove the lock whoever holds it")
	fl.BoolVar(&asJSON, "json", false, "print what was released as a JSON object")
	return cmd
}

// withConn opens the backend, calls f with it and a context bounded by
// --timeout, closes the backend and returns what f returned.
func (g *globals) withConn(ctx context.Context, f func(octx context.Context, c *conn) error) error {
	c, err := g.open(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	defer c.backend.Close()
	octx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	return f(octx, c)
}

func forceRelease(ctx context.Context, g *globals, c *conn, key string, asJSON bool, out io.Writer) error {
	fr, ok := c.backend.(dlock.ForceReleaser)
	if !ok {
		return exitWith(exitFailure, fmt.Errorf("release --force: the %s backend does not support force release", c.kind))
	}
	info, err := fr.ForceRelease(ctx, key)
	if err != nil {
		return opError(c, g.timeout, err)
	}
	info.Key = key
	if asJSON {
		j := toJSON(c.kind, info)
		action := "removed"
		if !info.Held {
			action = "none"
		}
		j.Action = &action
		return writeJSON(out, j)
	}
	if !info.Held {
		fmt.Fprintf(out, "lock %q was not held: nothing removed\n", key)
		return nil
	}
	fmt.Fprintf(out, "removed lock %q: %s\n", key, describeInfo(info))
	return nil
}

func describeInfo(info dlock.Info) string {
	if info.Kind != dlock.KindLock {
		return describeHolds(info)
	}
	parts := []string{"owner " + info.Owner, fmt.Sprintf("fence %d", info.Fence)}
	if info.TTL > 0 {
		parts = append(parts, "TTL left "+info.TTL.Round(time.Millisecond).String())
	}
	if info.Count > 1 {
		parts = append(parts, fmt.Sprintf("%d holds", info.Count))
	}
	return strings.Join(parts, ", ")
}

func ownerRelease(ctx context.Context, g *globals, c *conn, key, owner string, asJSON bool, out io.Writer) error {
	if len(owner) > dlock.MaxKeyLen {
		return usageErrorf("release: --owner is longer than %d bytes", dlock.MaxKeyLen)
	}
	req := dlock.Request{Key: key, Token: owner, TTL: dlock.DefaultTTL, Reentrant: true}
	holds := 1
	info := dlock.Info{Key: key, Held: true, Owner: owner, Count: 1, Waiters: -1}
	if in, ok := c.backend.(dlock.Inspector); ok {
		var err error
		if info, err = in.Inspect(ctx, key); err != nil {
			return opError(c, g.timeout, err)
		}
		info.Key = key
		switch {
		case !info.Held:
			return exitWith(exitFailure, fmt.Errorf("release: lock %q is not held: nothing released", key))
		case info.Kind != dlock.KindLock:
			return releaseHold(ctx, g, c, info, owner, asJSON, out)
		case info.Owner != owner:
			return exitWith(exitFailure, fmt.Errorf("release: lock %q is held by owner %q, not %q: nothing released", key, info.Owner, owner))
		}
		// Release exactly the grant inspected, all its reentrant holds.
		req.Fence = info.Fence
		holds = max(info.Count, 1)
	}
	for i := 0; i < holds; i++ {
		err := c.backend.Release(ctx, req)
		if errors.Is(err, dlock.ErrNotHeld) && i == 0 && req.Fence != 0 {
			// Not a reentrant owner's hold: a lease of its own (redlock
			// keeps those under a token derived from owner and fence).
			nr := req
			nr.Reentrant = false
			if err = c.backend.Release(ctx, nr); err == nil {
				req = nr
			}
		}
		if errors.Is(err, dlock.ErrNotHeld) {
			if i > 0 {
				break // released meanwhile by its holder
			}
			if c.kind == "etcd" || c.kind == "zk" {
				// These backends tie a lock to the holder's session or lease:
				// only the holding process can release it.
				hint := "stop the holder or let its session end"
				if _, ok := c.backend.(dlock.ForceReleaser); ok {
					hint = "use --force to remove it whoever holds it"
				}
				return exitWith(exitFailure, fmt.Errorf("release: lock %q was not released: the %s backend releases a lock only from the session that took it (%s)", key, c.kind, hint))
			}
			return exitWith(exitFailure, fmt.Errorf("release: lock %q is not held by owner %q: nothing released", key, owner))
		}
		if err != nil {
			return opError(c, g.timeout, err)
		}
	}
	if asJSON {
		j := toJSON(c.kind, info)
		action := "released"
		j.Action = &action
		return writeJSON(out, j)
	}
	fmt.Fprintf(out, "released lock %q: %s\n", key, describeInfo(info))
	return nil
}
