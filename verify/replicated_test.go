package verify_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/verify"
)

// openReplicated opens redislock on a Sentinel group from
// "redis+sentinel://h1,h2,h3/MASTER[?replicas=N]" or on a Redis Cluster
// from "redis+cluster://h1,h2,...[?replicas=N]"; replicas=N acquires with
// redislock.WithReplicas(N, 100ms).
//
// "weaken=MODE" runs it weakened (verify.WithWeakening).
func openReplicated(raw string) (dlock.Backend, func() error, error) {
	if strings.Contains(raw, verify.WeakenParam+"=") {
		return verify.WithWeakening(func(_ context.Context, url string, _ time.Duration) (dlock.Backend, func() error, error) {
			return openReplicated(url)
		})(context.Background(), raw, 0)
	}
	scheme, rest, _ := strings.Cut(raw, "://")
	rest, query, _ := strings.Cut(rest, "?")
	hosts, master, _ := strings.Cut(rest, "/")
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, nil, err
	}
	// The same client settings for both topologies: the cluster's seed
	// nodes or the sentinels are Addrs.
	o := &redis.UniversalOptions{
		Addrs:                 strings.Split(hosts, ","),
		MasterName:            master,
		ContextTimeoutEnabled: true,
		DialTimeout:           time.Second,
		ReadTimeout:           time.Second,
		WriteTimeout:          time.Second,
		MaxRetries:            -1,
		PoolSize:              4,
	}
	var rdb redis.UniversalClient
	if scheme == "redis+cluster" {
		rdb = redis.NewClusterClient(o.Cluster())
	} else {
		rdb = redis.NewFailoverClient(o.Failover())
	}
	var opts []redislock.Option
	if n := q.Get("replicas"); n != "" {
		k, err := strconv.Atoi(n)
		if err != nil {
			_ = rdb.Close()
			return nil, nil, err
		}
		opts = append(opts, redislock.WithReplicas(k, 100*time.Millisecond))
	}
	return redislock.New(rdb, opts...), rdb.Close, nil
}

// sentinelConfig is a short run on a local Sentinel group (a primary, two
// replicas, three sentinels).
func sentinelConfig(t *testing.T, url, fault string) verify.Config {
	t.Helper()
	cfg := shortConfig(t, fault)
	cfg.BackendURL = url
	cfg.Name = "sentinel"
	cfg.TTL = 500 * time.Millisecond
	cfg.Duration = 10 * time.Second
	return cfg
}

// Killing the Sentinel primary that holds the lock fails the group over:
// the fault is injected and seen by the workers, the fenced register
// accepts no stale write whatever the failover did to the lock, and the
// workers get the lock again afterwards.
func TestLeaderKillSentinel(t *testing.T) {
	run := runOne(t, sentinelConfig(t, "redis+sentinel://local", verify.FaultLeaderKill))
	checkReplicatedRun(t, run, verify.FaultLeaderKill)
}

// The same with acquisitions confirmed by both replicas
// (redislock.WithReplicas), under a pause of the primary past the
// sentinels' failover timeout.
func TestLeaderPauseSentinelReplicas(t *testing.T) {
	run := runOne(t, sentinelConfig(t, "redis+sentinel://local?replicas=2", verify.FaultLeaderPause))
	checkReplicatedRun(t, run, verify.FaultLeaderPause)
}

// Killing the primary of the lock's slot in a Redis Cluster of 3 × 2
// nodes fails that slot over to its replica.
func TestLeaderKillCluster(t *testing.T) {
	cfg := sentinelConfig(t, "redis+cluster://local", verify.FaultLeaderKill)
	cfg.Name = "cluster"
	run := runOne(t, cfg)
	checkReplicatedRun(t, run, verify.FaultLeaderKill)
}

// Cutting the Sentinel primary off from its replicas, the sentinels and
// every worker (its data nodes in network namespaces) fails the group
// over; the partition then heals. The fenced register accepts no stale
// write and every worker acquires again afterwards.
func TestLeaderPartitionSentinel(t *testing.T) {
	if err := testserver.NetNSAvailable(); err != nil {
		t.Skip(err)
	}
	run := runOne(t, sentinelConfig(t, "redis+sentinel://local", verify.FaultLeaderPartition))
	checkReplicatedRun(t, run, verify.FaultLeaderPartition)
}

// The positive control: on a Sentinel group whose lock forgets every
// grant at once (verify.WeakenForget), under primary kills, the checker
// must flag the run — lease overlaps, verdict FAIL — while the fenced
// register still accepts no stale write.
func TestWeakenedSentinelFlagged(t *testing.T) {
	cfg := sentinelConfig(t, "redis+sentinel://local?"+verify.WeakenParam+"="+verify.WeakenForget, verify.FaultLeaderKill)
	cfg.Name = "sentinel-weakened"
	run := runOne(t, cfg)
	checkWeakenedRun(t, run)
}

// With the fenced register's check turned off as well
// (verify.WeakenNoFenceCheck), the checker must also count stale writes
// accepted by the fenced register.
func TestWeakenedNoFenceCheckFlagged(t *testing.T) {
	cfg := sentinelConfig(t, "redis+sentinel://local?"+verify.WeakenParam+"="+verify.WeakenNoFenceCheck, verify.FaultLeaderKill)
	cfg.Name = "sentinel-no-fence-check"
	run := runOne(t, cfg)
	f := run.Findings
	if len(f.LeaseOverlaps) == 0 {
		t.Errorf("got no lease overlap on a lock that forgets its grants, want at least one (%d grants)", f.Grants)
	}
	if f.Fenced == nil || f.Fenced.StaleAccepted == 0 {
		t.Errorf("fenced register without its check: got no stale write accepted, want at least one (%+v)", f.Fenced)
	}
	if got := run.Verdict(); got != "FAIL" {
		t.Errorf("got verdict %s, want FAIL", got)
	}
}

// checkWeakenedRun asserts that the checker flagged a weakened run: lease
// overlaps and the verdict FAIL; the fenced register, whose fences come
// from the deployment, still accepts no stale write.
func checkWeakenedRun(t *testing.T, run *verify.RunResult) {
	t.Helper()
	f := run.Findings
	if len(f.LeaseOverlaps) == 0 {
		t.Errorf("got no lease overlap on a lock that forgets its grants, want at least one (%d grants)", f.Grants)
	}
	if got := run.Verdict(); got != "FAIL" {
		t.Errorf("got verdict %s, want FAIL (violations: %q)", got, f.Violations())
	}
	if f.Fenced != nil && f.Fenced.StaleAccepted != 0 {
		t.Errorf("fenced register: got %d stale writes accepted, want 0", f.Fenced.StaleAccepted)
	}
	t.Logf("lease overlaps %d, fenced stale rejected %d, naive stale accepted %d, naive lost %d",
		len(f.LeaseOverlaps), f.Fenced.WritesStale, f.Naive.StaleAccepted, f.Naive.LostUpdates)
}

// An unknown weakening is refused before anything starts.
func TestWeakenBadInput(t *testing.T) {
	o := verify.WithWeakening(func(context.Context, string, time.Duration) (dlock.Backend, func() error, error) {
		t.Error("the wrapped OpenFunc was called for an unknown weakening")
		return nil, nil, nil
	})
	if _, _, err := o(t.Context(), "redis://127.0.0.1:1?weaken=nothing", time.Second); !errors.Is(err, verify.ErrInvalidConfig) {
		t.Errorf("got %v, want an error matching ErrInvalidConfig", err)
	}
}

// checkReplicatedRun asserts what a leader fault must leave intact: the
// fault had its effect at least once, the fenced register accepted no
// stale write, and every worker acquired in the quiet phase. Lease
// overlaps are reported, not asserted: an asynchronous failover may lose a
// granted lock.
func checkReplicatedRun(t *testing.T, run *verify.RunResult, kind string) {
	t.Helper()
	f := run.Findings
	eff := 0
	for _, w := range f.Faults {
		if w.Kind == kind && w.Effective {
			eff++
		}
		t.Logf("%s: effective %v (%s) — %s", w.Kind, w.Effective, w.Why, w.Detail)
	}
	if eff == 0 {
		t.Errorf("got no effective %s, want at least one (invalid: %q)", kind, f.Invalid)
	}
	if f.Fenced == nil {
		t.Fatal("got no fenced register findings")
	}
	if f.Fenced.StaleAccepted != 0 {
		t.Errorf("fenced register: got %d stale writes accepted, want 0", f.Fenced.StaleAccepted)
	}
	if len(f.QuietMissing) != 0 {
		t.Errorf("workers %v did not acquire in the quiet phase", f.QuietMissing)
	}
	t.Logf("lease overlaps %d, fence regressions %d, naive lost %d", len(f.LeaseOverlaps), len(f.FenceRegressions), f.Naive.LostUpdates)
}

// Faults a deployment cannot take are refused before anything starts.
func TestReplicatedBadInput(t *testing.T) {
	tests := []struct{ url, fault string }{
		{"redlock://local?n=5", verify.FaultLeaderKill},
		{"redis+sentinel://local", verify.FaultProxy},
		{"redis+sentinel://local?n=1", verify.FaultLeaderPause},
		{"redis://127.0.0.1:6379", verify.FaultLeaderPause},
		{"redis+cluster://local", verify.FaultLeaderPartition},
		{"etcd://local", verify.FaultLeaderPartition},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%s", tt.url, tt.fault), func(t *testing.T) {
			cfg := shortConfig(t, tt.fault)
			cfg.BackendURL = tt.url
			_, err := verify.Run(t.Context(), cfg, open)
			if !errors.Is(err, verify.ErrInvalidConfig) {
				t.Errorf("got %v, want an error matching ErrInvalidConfig", err)
			}
		})
	}
}
