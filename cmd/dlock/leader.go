package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock-go/dlock"
)

const leaderLong = `Leader election on a key: one campaigner at a time leads; everybody can see who.

  dlock leader run [--value V] KEY -- COMMAND [ARGS...]   campaign, run COMMAND while leader
  dlock leader show KEY [--json]                          print the current leader
  dlock leader watch KEY [--json]                         print each change of leader

The leadership is a lease of the key's lock: renewed while the leader runs, lost with
a message (and COMMAND stopped) when it cannot be renewed. Its fencing token is the
leader's term: a number that grows with every new leadership of KEY.

Leader election needs a backend that supports it; others are refused with exit 2.`

func newLeaderCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "leader",
		Short: "Run a command while leader of an election, show or watch the leader",
		Long:  leaderLong,
		Example: `  # On every host: one of them runs the scheduler; when it dies, another takes over.
  dlock leader run --value "$(hostname)" scheduler -- ./scheduler --term "$DLOCK_TERM"

  # Who leads now?
  dlock leader show scheduler`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newLeaderRunCmd(g), newLeaderShowCmd(g), newLeaderWatchCmd(g))
	return cmd
}

const leaderRunLong = `Campaign in the election KEY and run COMMAND while leader.

dlock waits until it leads (up to --wait; default forever), proclaims --value (default:
the host name), and runs COMMAND with these variables added to its environment:

  DLOCK_KEY      the election's key
  DLOCK_TERM     the leader's term: a number that grows with every new leadership of KEY.
                 Pass it to what the leader writes to and let it reject older terms.
  DLOCK_FENCE    the same number (the leadership's fencing token)
  DLOCK_OWNER    the owner token of this leadership
  DLOCK_BACKEND  the backend URL

It renews the leadership every TTL/3 while COMMAND runs, resigns when COMMAND exits,
and exits with COMMAND's exit status. The other campaigners wait meanwhile; the first
in line leads next.

If the leadership is lost while COMMAND runs (the server stopped answering until it
could have expired, or an administrator force-released the key), dlock sends SIGTERM to
COMMAND's process group, SIGKILL after --grace, and exits with --lost-exit-code (76).
With --wait D, dlock gives up after D without running COMMAND and exits with
--conflict-exit-code (75). Signals are forwarded as by dlock run.`

const leaderRunExample = `  # Every host campaigns; one runs the scheduler. When its host dies, its leadership
  # expires within --ttl and the next campaigner takes over.
  dlock leader run --ttl 15s --value "$(hostname)" scheduler -- ./scheduler

  # Try once: lead now or exit 75.
  dlock leader run --wait 0 scheduler -- ./scheduler`

func newLeaderRunCmd(g *globals) *cobra.Command {
	f := &runFlags{leader: true, wait: waitValue{forever: true}}
	cmd := &cobra.Command{
		Use:     "run [flags] KEY -- COMMAND [ARGS...]",
		Short:   "Run a command while leader of an election",
		Long:    leaderRunLong,
		Example: leaderRunExample,
		Args: func(cmd *cobra.Command, args []string) error {
			var ue *usageError
			if err := runArgs(cmd, args); errors.As(err, &ue) {
				return usageErrorf("leader %s", ue.msg)
			} else if err != nil {
				return err
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("value") {
				f.value, _ = os.Hostname()
			}
			return runCommand(cmd.Context(), g, f, args[0], args[1:], cmd.ErrOrStderr())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.value, "value", "", "the value to proclaim while leader, shown by leader show and watch (default: the host name)")
	fl.DurationVar(&f.ttl, "ttl", dlock.DefaultTTL, "leadership lease lifetime; renewed every TTL/3 while the command runs; a dead leader is replaced within it")
	fl.Var(&f.wait, "wait", `how long to campaign while another leads: a duration, 0 (give up at once) or "forever"`)
	fl.IntVar(&f.conflictCode, "conflict-exit-code", exitConflict, "exit code when --wait ran out while another campaigner led")
	fl.IntVar(&f.lostCode, "lost-exit-code", exitLost, "exit code when the leadership is lost while the command runs")
	fl.DurationVar(&f.grace, "grace", 10*time.Second, "after a lost leadership: time between SIGTERM and SIGKILL to the command")
	fl.BoolVar(&f.fifo, "fifo", false, "join the server-side queue at once, without a first plain attempt (redis, etcd and ZooKeeper queue every wait anyway; redlock and postgres refuse it)")
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "print nothing when another campaigner leads")
	g.addMetricsFlag(cmd)
	return cmd
}

// leaderJSON is the JSON form of an election's leader (leader show --json,
// and each line of leader watch --json).
type leaderJSON struct {
	Time    string `json:"time,omitempty"` // watch: when the change was seen (RFC 3339)
	Key     string `json:"key"`
	Leader  bool   `json:"leader"` // the election has a leader
	Value   string `json:"value,omitempty"`
	Term    uint64 `json:"term,omitempty"`
	Owner   string `json:"owner,omitempty"`
	TTL     string `json:"ttl,omitempty"`    // show: remaining lifetime, e.g. "29.512s"
	TTLms   int64  `json:"ttl_ms,omitempty"` // the same in milliseconds
	Backend string `json:"backend"`          // the URL scheme
}

func toLeaderJSON(kind, key string, l dlock.Leader, ok bool) leaderJSON {
	j := leaderJSON{Key: key, Leader: ok, Backend: kind}
	if ok {
		j.Value, j.Term, j.Owner = l.Value, l.Term, l.Owner
		if l.TTL > 0 {
			j.TTL = l.TTL.Round(time.Millisecond).String()
			j.TTLms = l.TTL.Milliseconds()
		}
	}
	return j
}

// openElection connects and returns the election on key, with the hold
// that closes its Client and connection.
func openElection(ctx context.Context, g *globals, key string) (*dlock.Election, *hold, error) {
	c, err := g.open(ctx)
	if err != nil {
		return nil, nil, err
	}
	h := &hold{conn: c, client: dlock.New(c.backend, g.clientOptions()...)}
	if err := h.client.Err(); err != nil {
		h.close()
		return nil, nil, usageErrorf("%s", trim(err))
	}
	return h.client.Election(key), h, nil
}

// electionError turns a failed Leader call into the error to exit with.
func electionError(name string, c *conn, timeout time.Duration, err error) error {
	if errors.Is(err, errors.ErrUnsupported) {
		return usageErrorf("%s: the %s backend does not support leader election (%s)", name, c.kind, trim(err))
	}
	return opError(c, timeout, err)
}

func newLeaderShowCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show KEY",
		Short: "Print the current leader of an election",
		Long: `Print the current leader of the election KEY: the value it proclaimed, its term (the
leadership's fencing token), its owner token and the leadership's remaining TTL ("unknown"
where the backend ties it to a session).

Exit code 0 when the election has a leader, 3 when it has none (the output then says
so: "leader none", or "leader": false in JSON).`,
		Example: `  dlock leader show scheduler
  dlock leader show --json scheduler | jq -r .value
  if dlock leader show scheduler >/dev/null; then echo "somebody leads"; fi`,
		Args: keyArg("leader show"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			key := args[0]
			e, h, err := openElection(ctx, g, key)
			if err != nil {
				return err
			}
			defer h.close()
			l, ok, err := leaderNow(ctx, g, e, h, "leader show")
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if err := writeJSON(out, toLeaderJSON(h.conn.kind, key, l, ok)); err != nil {
					return err
				}
			} else {
				writeLeader(out, key, l, ok)
			}
			if !ok {
				return exitWith(exitNoLeader, nil)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the leader as a JSON object")
	return cmd
}

// leaderNow asks e for its leader within --timeout. ok is false if the
// election has none; any other failure is returned as the error of
// command name.
func leaderNow(ctx context.Context, g *globals, e *dlock.Election, h *hold, name string) (l dlock.Leader, ok bool, err error) {
	octx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	l, err = e.Leader(octx)
	if err != nil && !errors.Is(err, dlock.ErrNoLeader) {
		return l, false, electionError(name, h.conn, g.timeout, err)
	}
	return l, err == nil, nil
}

// writeLeader prints an election's leader as aligned "name value" lines.
func writeLeader(w io.Writer, key string, l dlock.Leader, ok bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "key\t%s\n", key)
	if !ok {
		fmt.Fprintf(tw, "leader\tnone\n")
	} else {
		fmt.Fprintf(tw, "leader\tyes\n")
		fmt.Fprintf(tw, "value\t%s\n", l.Value)
		fmt.Fprintf(tw, "term\t%d\n", l.Term)
		fmt.Fprintf(tw, "owner\t%s\n", l.Owner)
		fmt.Fprintf(tw, "ttl\t%s\n", ttlText(l.TTL))
	}
	_ = tw.Flush()
}

func newLeaderWatchCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "watch KEY",
		Short: "Print each change of an election's leader",
		Long: `Print the leader of the election KEY, then one line each time it changes (a new term
or a new value), until interrupted (SIGINT or SIGTERM: exit 0). A line reads

  2026-01-02T15:04:05.000Z term=12 owner=OWNER value="VALUE"
  2026-01-02T15:04:09.000Z no leader

With --json each line is a JSON object (as leader show --json, with a "time" field).
Changes are seen within a second; a leader that came and went faster may be missed.`,
		Example: `  dlock leader watch scheduler
  dlock leader watch --json scheduler | jq -r 'select(.leader) | .value'`,
		Args: keyArg("leader watch"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			key := args[0]
			e, h, err := openElection(ctx, g, key)
			if err != nil {
				return err
			}
			defer h.close()
			// Leader election unsupported, or the server unreachable: say
			// so at once rather than watching nothing.
			if _, _, err := leaderNow(ctx, g, e, h, "leader watch"); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			for l := range e.Observe(ctx) {
				now := time.Now().UTC()
				ok := l != (dlock.Leader{})
				if asJSON {
					j := toLeaderJSON(h.conn.kind, key, l, ok)
					j.Time = now.Format(time.RFC3339Nano)
					j.TTL, j.TTLms = "", 0
					if err := writeJSONLine(out, j); err != nil {
						return err
					}
					continue
				}
				stamp := now.Format("2006-01-02T15:04:05.000Z07:00")
				if !ok {
					fmt.Fprintf(out, "%s no leader\n", stamp)
				} else {
					fmt.Fprintf(out, "%s term=%d owner=%s value=%q\n", stamp, l.Term, l.Owner, l.Value)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print each change as a JSON object on one line")
	return cmd
}

// writeJSONLine prints v as JSON on one line.
func writeJSONLine(w io.Writer, v any) error { return json.NewEncoder(w).Encode(v) }
