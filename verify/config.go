package verify

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
)

// OpenFunc builds a dlock.Backend from a backend URL such as
// "redis://127.0.0.1:6379". The program provides it: the dlock CLI passes
// its URL factory, tests pass a factory for the schemes they use. The
// coordinator calls it once to probe the backend; every worker calls it in
// its own process. close frees what the factory opened (the driver client)
// and is called after the dlock.Client built on the Backend is closed.
//
// ttl is Config.TTL, the lease TTL the workers will use. A backend whose
// connection carries its own timeout must derive it from ttl: a ZooKeeper
// session timeout longer than the TTL keeps a paused or killed holder's
// lock alive for the session, not the TTL, so the faults (scaled to the
// TTL) would never move the lock.
type OpenFunc func(ctx context.Context, url string, ttl time.Duration) (b dlock.Backend, close func() error, err error)

// WorkerEnv is set to "1" in the environment of every worker process the
// coordinator starts. A program that re-executes itself as a worker
// without a dedicated subcommand (a test binary, in TestMain) checks it
// and then calls WorkerMain.
const WorkerEnv = "DLOCK_VERIFY_WORKER"

// The fault names accepted in Config.Faults. Combine several into one
// experiment with "+", e.g. "pause+kill".
const (
	// FaultNone injects nothing: the baseline.
	FaultNone = "none"
	// FaultPause stops the current lock holder with SIGSTOP for 1.5–3 ×
	// TTL, then continues it with SIGCONT. It targets a holder inside its
	// read-modify-write (after its read, before its write) when one shows
	// up within 2 × TTL, else any holder.
	FaultPause = "pause"
	// FaultKill kills the current holder with SIGKILL and starts a new
	// process for that worker.
	FaultKill = "kill"
	// FaultRestart kills the lock server (one node of several) with
	// SIGKILL and restarts it after 0.1–1.5 × TTL, without persistence: a
	// Redis server comes back empty. Needs a local server.
	FaultRestart = "restart"
	// FaultRestartPersist is FaultRestart on a server started with
	// persistence (Redis: appendonly yes, appendfsync always), so it comes
	// back with its data. etcd and ZooKeeper always persist.
	FaultRestartPersist = "restart-persist"
	// FaultServerPause stops the lock server (one node of several) with
	// SIGSTOP for 1.5–3 × TTL. Needs a local server.
	FaultServerPause = "server-pause"
	// FaultProxy puts an in-process TCP proxy between the workers and the
	// lock server(s) and, per window, either delays every chunk of data by
	// TTL/5 for 2 × TTL, blackholes the connections (holds all data) for
	// 1.5–3 × TTL, or resets every connection.
	FaultProxy = "proxy"
	// FaultLeaderKill kills the node that leads the local deployment — the
	// Sentinel primary, the Cluster primary of the lock key's slot, the
	// etcd or ZooKeeper leader, the only node of a single server — with
	// SIGKILL and restarts it after 3–5 × TTL and at least the
	// deployment's failover time. A Redis node comes back empty. Needs a
	// local server other than Redlock and PostgreSQL.
	FaultLeaderKill = "leader-kill"
	// FaultLeaderPause stops the leading node (see FaultLeaderKill) with
	// SIGSTOP for 3–5 × TTL, past the failover timeout, so it resumes
	// believing it still leads. Needs a local server other than Redlock.
	FaultLeaderPause = "leader-pause"
	// FaultLeaderPartition cuts the leading node of a local Sentinel
	// group, etcd cluster or ZooKeeper ensemble ("redis+sentinel://local",
	// "etcd://local?n=3", "zk://local?n=3") — the primary, the leader —
	// off from the other nodes and from every client for 3–5 × TTL, then
	// heals the partition. The deployment then runs with one network
	// namespace per data node or member (Linux, root, the ip command);
	// the sentinels stay on loopback.
	FaultLeaderPartition = "leader-partition"
)

var faultNames = []string{FaultNone, FaultPause, FaultKill, FaultRestart, FaultRestartPersist, FaultServerPause, FaultProxy, FaultLeaderKill, FaultLeaderPause, FaultLeaderPartition}

// FaultNames returns the known fault names, for help texts.
func FaultNames() []string { return slices.Clone(faultNames) }

// The resource modes of Config.ResourceMode.
const (
	// ModeFenced runs each read-modify-write on a fenced register: the
	// read claims the lease's fence and the write goes through
	// fence.Redis.Set, so the resource rejects a holder superseded by a
	// later fence.
	ModeFenced = "fenced"
	// ModeNaive runs each read-modify-write with plain GET and SET: the
	// negative control, which loses updates whenever the lock fails to
	// exclude.
	ModeNaive = "naive"
	// ModeBoth does both in every critical section, on two registers.
	ModeBoth = "both"
)

// LocalHost is the host name that makes the coordinator start the lock
// server itself, e.g. "redis://local". See Config.BackendURL.
const LocalHost = "local"

// ErrInvalidConfig is matched (errors.Is) by every error Run returns for a
// Config it cannot run.
var ErrInvalidConfig = errors.New("verify: invalid configuration")

// ErrUnavailable is matched by the error Run returns when the backend (or a
// server the coordinator needs) does not answer.
var ErrUnavailable = errors.New("verify: backend does not answer")

// Config describes one verification: a backend, the faults to inject and
// the size of each run. Run accepts only valid values and never corrects
// them; DefaultConfig returns a Config filled with the defaults below.
type Config struct {
	// BackendURL is the lock server the workers open with the OpenFunc.
	// With the host "local" — "redis://local", "redlock://local" (3 nodes;
	// "redlock://local?n=5" for 5), "etcd://local", "zk://local" (one
	// member; "?n=3" for an etcd cluster or a ZooKeeper ensemble of 3),
	// "redis+sentinel://local" (a primary, two replicas and three
	// sentinels; "?n=2" for one replica), "redis+cluster://local" (three
	// primaries with one replica each),
	// "postgres://local" (user and database postgres) — the
	// coordinator starts the server(s) itself on loopback for every run
	// (via internal/testserver) and hands the workers the real address;
	// only then are the faults restart, restart-persist, server-pause,
	// leader-kill, leader-pause and leader-partition possible. Path and query of a local
	// URL are kept. Default "redis://local".
	BackendURL string

	// Name labels the backend in the report. Default: the URL's scheme.
	Name string

	// Faults lists the experiments to run, one fault name each (see
	// FaultNames), or several joined with "+" for one combined experiment.
	// Every experiment gets Runs runs and one row in the report. Default
	// {"pause"}. An unknown name is an ErrInvalidConfig error.
	Faults []string

	// Duration is the fault phase of each run, after which faults stop
	// and every worker must acquire the lock once more (the quiet phase).
	// Default 60s. It must be at least 10 × TTL.
	Duration time.Duration

	// Workers is the number of worker processes contending for the lock.
	// Default 5; at least 2.
	Workers int

	// Runs is the number of runs per experiment; run i uses Seed+i.
	// Default 1.
	Runs int

	// Seed drives the fault schedule (times, kinds, durations) and the
	// workers' random delays: the same seed gives the same schedule. Which
	// process a fault hits depends on who holds the lock at that moment.
	// Default 1.
	Seed int64

	// OutDir receives, per run, the histories (one JSON-lines file per
	// process), the workers' stderr, a summary and porcupine's HTML
	// timelines, under OutDir/NAME/FAULT/seed-SEED/; Run also writes
	// OutDir/report.md (overwritten by each Run). Default: a new directory
	// under os.TempDir().
	OutDir string

	// TTL is the lease TTL the workers use. Default 1s. Must be at least
	// 50ms and at least the backend's minimum (etcd ≈ 2s, ZooKeeper ≈ 2 ×
	// tickTime).
	TTL time.Duration

	// ResourceMode selects the protected resource: ModeFenced, ModeNaive
	// or ModeBoth. Default ModeBoth.
	ResourceMode string

	// FIFO makes every worker acquire with dlock.WithFIFO(): waiters queue
	// on the server and a release hands the lock to the next one. Only
	// backends that offer the queue as an option change behaviour
	// (redislock: the hand-off without a claim request; memlock in
	// process); etcd and ZooKeeper always queue and run as without it. A
	// backend without a server-side queue (redlock) cannot take it: Run
	// returns an ErrInvalidConfig error from its first probe. The report
	// marks the runs "(FIFO)". Default false.
	FIFO bool

	// Kind selects what the workers take on the key: KindLock ("lock",
	// the lock; "" means the same), "permits:N" (one permit of an
	// N-permit semaphore, N in 1..64), KindRW ("rw": a read-write lock,
	// one acquisition in four a write hold, the others read holds, which
	// touch no register) or KindElection ("election": campaign, lead for
	// the critical section, resign). The backend must support the kind.
	// Default "" (the lock).
	Kind string

	// Exe is the argv prefix that starts a worker process, e.g.
	// {os.Args[0], "verify-worker"}; the coordinator appends the worker's
	// arguments and sets WorkerEnv=1 in its environment. That process must
	// call WorkerMain with the appended arguments. Required unless
	// InProcess.
	Exe []string

	// InProcess runs the workers as goroutines of the calling process,
	// sharing one dlock.Client on one Backend opened once: for in-process
	// backends such as memlock, which cannot be shared between processes
	// (the harness otherwise needs a server backend). Only the fault
	// "none" is possible: stopping a "process" would stop the coordinator
	// too. The URL is passed to the OpenFunc as it is (it may have no
	// host, e.g. "mem://"; "local" starts nothing). Default false.
	InProcess bool

	// Progress receives one line per run and phase; nil discards them.
	Progress func(msg string)
}

// DefaultConfig returns the defaults documented on Config (Exe is left
// empty: only the program knows how to re-execute itself).
func DefaultConfig() Config {
	return Config{
		BackendURL:   "redis://local",
		Faults:       []string{FaultPause},
		Duration:     60 * time.Second,
		Workers:      5,
		Runs:         1,
		Seed:         1,
		TTL:          time.Second,
		ResourceMode: ModeBoth,
	}
}

const minTTL = 50 * time.Millisecond

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// experiment is one entry of Config.Faults, parsed.
type experiment struct {
	name  string   // as given, normalised ("pause+kill")
	kinds []string // the fault kinds it mixes, without "none"
}

func (e experiment) has(kind string) bool { return slices.Contains(e.kinds, kind) }

// parseFaults validates Config.Faults.
func parseFaults(list []string) ([]experiment, error) {
	if len(list) == 0 {
		return nil, invalid("no faults given (use %q for a baseline without faults)", FaultNone)
	}
	var exps []experiment
	for _, entry := range list {
		var e experiment
		var names []string
		for _, f := range strings.Split(entry, "+") {
			f = strings.ToLower(strings.TrimSpace(f))
			if !slices.Contains(faultNames, f) {
				return nil, invalid("unknown fault %q (known: %s)", f, strings.Join(faultNames, ", "))
			}
			if slices.Contains(names, f) {
				continue
			}
			names = append(names, f)
			if f != FaultNone {
				e.kinds = append(e.kinds, f)
			}
		}
		if e.has(FaultRestart) && e.has(FaultRestartPersist) {
			return nil, invalid("faults %q and %q need different servers and cannot be combined", FaultRestart, FaultRestartPersist)
		}
		if len(e.kinds) == 0 {
			e.name = FaultNone
		} else {
			e.name = strings.Join(e.kinds, "+")
		}
		exps = append(exps, e)
	}
	return exps, nil
}

// backendURL is a parsed Config.BackendURL.
type backendURL struct {
	raw    string
	scheme string
	local  bool   // host "local": the coordinator starts the servers
	tail   string // path and query, e.g. "/2?n=5", kept for the workers
	nodes  int    // local redlock, etcd, zk: nodes; redis+sentinel: data nodes
	netns  bool   // local etcd, zk: one network namespace per member
}

var localSchemes = []string{"redis", "redlock", "etcd", "zk", "postgres", "redis+sentinel", "redis+cluster"}

func parseBackendURL(raw string, inProcess bool) (backendURL, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || scheme == "" {
		return backendURL{}, invalid("backend URL %q: want SCHEME://HOST..., e.g. redis://127.0.0.1:6379 or redis://local", RedactURL(raw))
	}
	u := backendURL{raw: raw, scheme: strings.ToLower(scheme)}
	host, tail := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		host, tail = rest[:i], rest[i:]
	}
	if host == "" && !inProcess {
		return backendURL{}, invalid("backend URL %q has no host", RedactURL(raw))
	}
	if host == LocalHost && !inProcess {
		if !slices.Contains(localSchemes, u.scheme) {
			return backendURL{}, invalid("backend URL %q: the coordinator can start servers only for %s://local", RedactURL(raw), strings.Join(localSchemes, "://local, "))
		}
		u.local = true
		u.tail = tail
		if n, ok := localNodes[u.scheme]; ok {
			u.nodes = n
			if i := strings.IndexByte(tail, '?'); i >= 0 {
				q, err := url.ParseQuery(tail[i+1:])
				if err != nil {
					return backendURL{}, invalid("backend URL %q: %v", raw, err)
				}
				if n := q.Get("n"); n != "" {
					if _, err := fmt.Sscanf(n, "%d", &u.nodes); err != nil || u.nodes < 1 || u.nodes > 9 || fmt.Sprint(u.nodes) != n {
						return backendURL{}, invalid("backend URL %q: n=%s is not a node count in 1..9", raw, n)
					}
					q.Del("n")
					u.tail = tail[:i]
					if len(q) > 0 {
						u.tail += "?" + q.Encode()
					}
				}
			}
		}
		if u.scheme == "redis+sentinel" && (u.tail == "" || u.tail[0] == '?') {
			u.tail = "/" + sentinelMaster + u.tail
		}
	}
	return u, nil
}

// RedactURL returns raw with the password of its user info replaced by
// "xxxxx", for messages; other strings are returned unchanged. The dlock
// command uses it too.
func RedactURL(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	auth, tail := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		auth, tail = rest[:i], rest[i:]
	}
	at := strings.LastIndex(auth, "@")
	if at < 0 {
		return raw
	}
	user, _, hasPass := strings.Cut(auth[:at], ":")
	if !hasPass {
		return raw
	}
	return scheme + "://" + user + ":xxxxx@" + auth[at+1:] + tail
}

// withHosts returns raw with its host list replaced by hosts (keeping the
// user info, path and query): how workers are pointed at the proxy.
func withHosts(raw string, hosts []string) string {
	scheme, rest, _ := strings.Cut(raw, "://")
	auth, tail := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		auth, tail = rest[:i], rest[i:]
	}
	user := ""
	if at := strings.LastIndex(auth, "@"); at >= 0 {
		user = auth[:at+1]
	}
	return scheme + "://" + user + strings.Join(hosts, ",") + tail
}

// hostsOf returns the host list of raw.
func hostsOf(raw string) []string {
	_, rest, _ := strings.Cut(raw, "://")
	auth := rest
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		auth = rest[:i]
	}
	if at := strings.LastIndex(auth, "@"); at >= 0 {
		auth = auth[at+1:]
	}
	return strings.Split(auth, ",")
}

// validated is a Config that passed validation.
type validated struct {
	Config
	url  backendURL
	exps []experiment
}

func (c Config) validate() (validated, error) {
	v := validated{Config: c}
	if c.BackendURL == "" {
		return v, invalid("empty backend URL (use %q to let the harness start a server)", "redis://local")
	}
	var err error
	if v.url, err = parseBackendURL(c.BackendURL, c.InProcess); err != nil {
		return v, err
	}
	if v.exps, err = parseFaults(c.Faults); err != nil {
		return v, err
	}
	if c.Workers < 2 {
		return v, invalid("workers must be at least 2 (contention needs two), got %d", c.Workers)
	}
	if c.Workers > 64 {
		return v, invalid("workers must be at most 64, got %d", c.Workers)
	}
	if c.TTL < minTTL {
		return v, invalid("TTL %v is below the harness minimum %v", c.TTL, minTTL)
	}
	if c.Duration < 10*c.TTL {
		return v, invalid("duration %v must be at least 10 × TTL (%v)", c.Duration, 10*c.TTL)
	}
	if c.Runs < 1 {
		return v, invalid("runs must be at least 1, got %d", c.Runs)
	}
	switch c.ResourceMode {
	case ModeFenced, ModeNaive, ModeBoth:
	default:
		return v, invalid("unknown resource mode %q (known: %s, %s, %s)", c.ResourceMode, ModeFenced, ModeNaive, ModeBoth)
	}
	if v.Kind, err = validKind(c.Kind); err != nil {
		return v, err
	}
	if v.Name == "" {
		v.Name = v.url.scheme
	}
	if strings.ContainsAny(v.Name, "/\\") {
		return v, invalid("name %q must not contain a path separator", v.Name)
	}
	if c.InProcess {
		for _, e := range v.exps {
			if len(e.kinds) > 0 {
				return v, invalid("fault %q needs worker processes; in-process workers support only %q", e.name, FaultNone)
			}
		}
	} else {
		if !supported {
			return v, invalid("worker processes need a Unix system; use InProcess")
		}
		if len(c.Exe) == 0 || c.Exe[0] == "" {
			return v, invalid("Exe (the command that starts a worker process) is required unless InProcess")
		}
	}
	for _, e := range v.exps {
		for _, k := range e.kinds {
			switch k {
			case FaultRestart, FaultRestartPersist, FaultServerPause, FaultLeaderKill, FaultLeaderPause, FaultLeaderPartition:
				if !v.url.local {
					return v, invalid("fault %q needs a server the harness starts itself: use %s://local", k, v.url.scheme)
				}
			}
			if err := checkReplicatedFault(&v.url, k); err != nil {
				return v, err
			}
		}
	}
	return v, nil
}
