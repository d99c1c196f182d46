package verify

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// The fault schedule: after a gap of 1–2 × TTL, a fault drawn from the
// experiment's kinds with its parameters; then the next gap once the
// window has ended. All draws come from one generator seeded with the
// run's seed, in a fixed order, so a seed always gives the same sequence
// of gaps, kinds and parameters. Which process is hit depends on who holds
// the lock at that moment.

// plan is one drawn fault.
type plan struct {
	gap    time.Duration
	kind   string
	length time.Duration // how long the fault lasts
	node   int           // server node (restart, server-pause)
	mode   int           // proxy: 0 delay, 1 blackhole, 2 reset
	nodes  []int         // proxy: the nodes whose proxies are hit
}

var proxyModes = []string{"delay", "blackhole", "reset"}

// schedule draws plans from the seed.
type schedule struct {
	rng   *rand.Rand
	kinds []string
	ttl   time.Duration
	nodes int // lock server nodes (or proxies)
}

func newSchedule(seed int64, kinds []string, ttl time.Duration, nodes int) *schedule {
	return &schedule{rng: rand.New(rand.NewPCG(uint64(seed), 0x6e656d65736973)), kinds: kinds, ttl: ttl, nodes: max(nodes, 1)}
}

func (s *schedule) factor(lo, hi float64) time.Duration {
	return time.Duration((lo + (hi-lo)*s.rng.Float64()) * float64(s.ttl))
}

func (s *schedule) next() plan {
	p := plan{gap: s.factor(1, 2)}
	if len(s.kinds) == 0 {
		return p
	}
	p.kind = s.kinds[s.rng.IntN(len(s.kinds))]
	switch p.kind {
	case FaultPause, FaultServerPause:
		p.length = s.factor(1.5, 3)
		p.node = s.rng.IntN(s.nodes)
	case FaultRestart, FaultRestartPersist:
		p.length = s.factor(0.1, 1.5)
		p.node = s.rng.IntN(s.nodes)
	case FaultLeaderKill, FaultLeaderPause, FaultLeaderPartition:
		p.length = s.factor(3, 5)
	case FaultProxy:
		p.mode = s.rng.IntN(len(proxyModes))
		switch p.mode {
		case 0:
			p.length = 2 * s.ttl
		case 1:
			p.length = s.factor(1.5, 3)
		}
		perm := s.rng.Perm(s.nodes)
		p.nodes = perm[:1+s.rng.IntN(s.nodes)]
	}
	return p
}

// nemesisLoop injects faults until chaos ends; a window that has begun
// runs to its end unless ctx (the whole run) ends, and always heals.
func (r *run) nemesisLoop(ctx, chaos context.Context, resAddr string) error {
	nodes := 1
	if r.servers != nil {
		nodes = len(r.servers.nodes)
	}
	if len(r.proxies) > 0 {
		nodes = len(r.proxies)
	}
	s := newSchedule(r.seed, r.exp.kinds, r.cfg.TTL, nodes)
	for {
		p := s.next()
		sleep(chaos, p.gap)
		if chaos.Err() != nil || p.kind == "" {
			if p.kind == "" {
				<-chaos.Done()
			}
			return nil
		}
		if err := r.inject(ctx, p, resAddr); err != nil {
			return err
		}
	}
}

// holder is a snapshot of a worker holding the lock.
type holder struct {
	p     *wproc
	owner string
	fence uint64
	phase string
}

// pickHolder waits up to wait for a worker inside its read-modify-write
// (after its read, before its write), and in the second half of the wait
// accepts any holder. It returns false if there was none.
func (r *run) pickHolder(ctx context.Context, wait time.Duration) (holder, bool) {
	start := time.Now()
	t := time.NewTimer(wait / 2)
	defer t.Stop()
	for {
		anyHolder := time.Since(start) >= wait/2
		r.mu.Lock()
		var best holder
		for w := 1; w <= r.cfg.Workers; w++ {
			p := r.procs[w]
			if p == nil || p.owner == "" {
				continue
			}
			select {
			case <-p.exited:
				continue
			default:
			}
			if p.phase == "read" || (anyHolder && best.p == nil) {
				best = holder{p: p, owner: p.owner, fence: p.fence, phase: p.phase}
				if p.phase == "read" {
					break
				}
			}
		}
		r.mu.Unlock()
		if best.p != nil {
			return best, true
		}
		if time.Since(start) >= wait {
			return holder{}, false
		}
		select {
		case <-ctx.Done():
			return holder{}, false
		case <-r.changed:
		case <-t.C:
			t.Reset(wait - time.Since(start))
		}
	}
}

// currentHolder returns a worker holding the lock now, if any.
func (r *run) currentHolder() holder {
	r.mu.Lock()
	defer r.mu.Unlock()
	for w := 1; w <= r.cfg.Workers; w++ {
		if p := r.procs[w]; p != nil && p.owner != "" {
			return holder{p: p, owner: p.owner, fence: p.fence, phase: p.phase}
		}
	}
	return holder{}
}

// window logs a fault window.
func (r *run) window(e Event) {
	if e.CompleteNs == 0 {
		e.CompleteNs = monoNow()
	}
	r.nemesis.log(e)
}

func (r *run) missed(kind, why string) {
	now := monoNow()
	r.window(Event{Op: kind, InvokeNs: now, CompleteNs: now, Outcome: OutcomeFail, Err: why})
}

// inject applies one planned fault and logs its window.
func (r *run) inject(ctx context.Context, p plan, resAddr string) error {
	switch p.kind {
	case FaultPause:
		r.pauseHolder(ctx, p)
	case FaultKill:
		return r.killHolder(ctx, p, resAddr)
	case FaultRestart, FaultRestartPersist:
		return r.restartServer(ctx, p)
	case FaultServerPause:
		return r.pauseServer(ctx, p)
	case FaultProxy:
		r.proxyFault(ctx, p)
	case FaultLeaderKill, FaultLeaderPause, FaultLeaderPartition:
		return r.leaderFault(ctx, p)
	}
	return nil
}

// pauseHolder stops the current holder's process (SIGSTOP) for p.length.
func (r *run) pauseHolder(ctx context.Context, p plan) {
	ttl := r.cfg.TTL
	h, ok := r.pickHolder(ctx, 2*ttl)
	if !ok {
		r.missed(p.kind, "no worker held the lock within 2 × TTL")
		return
	}
	start := monoNow()
	if err := stopProcess(h.p.pid); err != nil {
		r.missed(p.kind, fmt.Sprintf("SIGSTOP %s: %v", h.p.name, err))
		return
	}
	sleep(ctx, p.length)
	err := contProcess(h.p.pid)
	e := Event{Op: p.kind, InvokeNs: start, Outcome: OutcomeOK, Target: h.p.name, Owner: h.owner, Fence: h.fence,
		Detail: fmt.Sprintf("SIGSTOP for %v (%.2f × TTL), holder in phase %q", p.length.Round(time.Millisecond), float64(p.length)/float64(ttl), h.phase)}
	if err != nil {
		e.Err = "SIGCONT: " + err.Error()
	}
	r.window(e)
}

// killHolder kills the current holder's process and starts a new worker
// in its place.
func (r *run) killHolder(ctx context.Context, p plan, resAddr string) error {
	h, ok := r.pickHolder(ctx, 2*r.cfg.TTL)
	if !ok {
		r.missed(p.kind, "no worker held the lock within 2 × TTL")
		return nil
	}
	r.mu.Lock()
	h.p.killed = true
	r.mu.Unlock()
	start := monoNow()
	if err := killProcess(h.p.pid); err != nil {
		r.missed(p.kind, fmt.Sprintf("SIGKILL %s: %v", h.p.name, err))
		return nil
	}
	<-h.p.exited
	e := Event{Op: p.kind, InvokeNs: start, Outcome: OutcomeOK, Target: h.p.name, Owner: h.owner, Fence: h.fence,
		Detail: fmt.Sprintf("SIGKILL, holder in phase %q; worker restarted", h.phase)}
	if _, err := r.spawn(ctx, h.p.worker, resAddr); err != nil {
		return err
	}
	r.window(e)
	return nil
}

// restartServer kills lock server node p.node and restarts it after
// p.length, with or without its data.
func (r *run) restartServer(ctx context.Context, p plan) error {
	n := r.servers.nodes[p.node]
	persist := "without"
	if p.kind == FaultRestartPersist || r.cfg.url.scheme == "etcd" || r.cfg.url.scheme == "zk" || r.cfg.url.scheme == "postgres" {
		persist = "with"
	}
	return r.serverOutage(ctx, p, "kill", n.Kill, "restart", n.Restart,
		fmt.Sprintf("SIGKILL, down %v, restarted %s persistence", p.length.Round(time.Millisecond), persist))
}

// pauseServer stops lock server node p.node (SIGSTOP) for p.length.
func (r *run) pauseServer(ctx context.Context, p plan) error {
	n := r.servers.nodes[p.node]
	return r.serverOutage(ctx, p, "pause", n.Pause, "resume", n.Resume,
		fmt.Sprintf("SIGSTOP for %v (%.2f × TTL)", p.length.Round(time.Millisecond), float64(p.length)/float64(r.cfg.TTL)))
}

// serverOutage takes lock server node p.node down with down (named
// downVerb in errors), brings it back with up (upVerb) after p.length, and
// records the fault's window with detail.
func (r *run) serverOutage(ctx context.Context, p plan, downVerb string, down func() error, upVerb string, up func() error, detail string) error {
	addr := r.servers.nodeAddr(p.node)
	h := r.currentHolder()
	start := monoNow()
	if err := down(); err != nil {
		return fmt.Errorf("verify: %s lock server %s: %w", downVerb, addr, err)
	}
	sleep(ctx, p.length)
	if err := up(); err != nil {
		return fmt.Errorf("verify: %s lock server %s: %w", upVerb, addr, err)
	}
	r.window(Event{Op: p.kind, InvokeNs: start, Outcome: OutcomeOK, Target: "server " + addr, Owner: h.owner, Fence: h.fence,
		Value: int64(p.length), Nodes: len(r.servers.nodes), Detail: detail})
	return nil
}

// proxyFault delays, blackholes or resets the proxies to p.nodes.
func (r *run) proxyFault(ctx context.Context, p plan) {
	ttl := r.cfg.TTL
	var target string
	for i, n := range p.nodes {
		if i > 0 {
			target += ","
		}
		target += r.proxies[n].upstream
	}
	h := r.currentHolder()
	start := monoNow()
	e := Event{Op: p.kind, InvokeNs: start, Outcome: OutcomeOK, Target: "proxy to " + target, Owner: h.owner, Fence: h.fence, Nodes: len(r.proxies)}
	switch p.mode {
	case 0:
		d := ttl / 5
		for _, n := range p.nodes {
			r.proxies[n].setDelay(d)
		}
		sleep(ctx, p.length)
		for _, n := range p.nodes {
			r.proxies[n].setDelay(0)
		}
		e.Value = int64(d)
		e.Detail = fmt.Sprintf("delay %v per chunk for %v", d, p.length)
	case 1:
		for _, n := range p.nodes {
			r.proxies[n].blackhole(true)
		}
		sleep(ctx, p.length)
		for _, n := range p.nodes {
			r.proxies[n].blackhole(false)
		}
		e.Value = int64(p.length)
		e.Detail = fmt.Sprintf("blackhole for %v (%.2f × TTL)", p.length.Round(time.Millisecond), float64(p.length)/float64(ttl))
	default:
		for _, n := range p.nodes {
			e.Count += int64(r.proxies[n].reset())
		}
		e.Detail = fmt.Sprintf("reset %d connections", e.Count)
	}
	r.window(e)
}
