package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// A locker is one client of a lock service, as one process would hold it:
// its own connections. Safe for concurrent use.
type locker interface {
	// lock waits until key is held or ctx ends.
	lock(ctx context.Context, key string) (held, error)
	close() error
}

// held is one acquired lock.
type held interface {
	unlock(ctx context.Context) error
	// lost reports that the library knows the lock was lost (false when it
	// cannot tell).
	lost() bool
}

// lossCauser is implemented by a held lock that can say why it was lost.
type lossCauser interface {
	lossCause() string
}

// openOpts configure a new locker.
type openOpts struct {
	ttl   time.Duration // lease TTL
	poll  time.Duration // retry interval of the polling subjects
	count *counter      // counts the client's requests; nil for none
	pool  int           // go-redis pool size, 0 for the default
}

type role int

const (
	roleFloor role = iota // a baseline: raw SET NX PX + compare-and-delete, a fenced floor or the hand-off floor
	roleDlock             // this project
	rolePeer              // another library
)

func (r role) String() string {
	return [...]string{"floor", "dlock", "peer"}[r]
}

// server is the kind of server a subject locks on. Subjects on the same
// server are compared with each other ("best peer").
type server int

const (
	srvRedis  server = iota // one Redis node
	srvRedis5               // five independent Redis nodes
	srvEtcd
	srvZK
	srvMem // in-process
)

func (s server) String() string {
	return [...]string{"Redis", "Redis ×5", "etcd", "ZooKeeper", "in-process"}[s]
}

// subject is a lock implementation under test.
type subject struct {
	id     string // the -backends name
	name   string // shown in tables
	role   role
	server server
	// open returns a new client. An error matching errUnavailable means the
	// subject cannot run (yet); the tables say why.
	open func(e *env, o openOpts) (locker, error)
	// unavailable, if set, says why the subject cannot run at all ("" when
	// it can), without starting servers.
	unavailable func() string
	renews      bool   // keeps its leases alive by itself (S5)
	waitMode    string // how waiters learn of a release, for the tables
	inProcess   bool   // no separate process can share its locks (S4)
	// wakesOnReleaseOnly: its waiters wake only on a release, never on a
	// lease's expiry, so a killed holder strands them (S4).
	wakesOnReleaseOnly bool
	serverKeys         func(e *env, prefix string) (int, error)
}

var errUnavailable = errors.New("not available")

func unavailable(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errUnavailable, fmt.Sprintf(format, args...))
}

// reason returns why s cannot run, or "".
func (s *subject) reason() string {
	if s.unavailable != nil {
		return s.unavailable()
	}
	return ""
}

// subjects lists every subject in table order: the floors, dlock's
// backends, then the peers.
func subjects() []*subject {
	return []*subject{
		floorSubject(),
		fencedFloorSubject(),
		fencedFloor5Subject(),
		fencedFloorRueidisSubject(),
		handoffFloorSubject(),
		dlockRedisSubject(false),
		dlockRedisSubject(true),
		redlockSubject(),
		etcdlockSubject(),
		zklockSubject(),
		memlockSubject(false),
		memlockSubject(true),
		redsyncSubject(1),
		redsyncSubject(5),
		bsmSubject(),
		rueidisSubject(),
		etcdMutexSubject(),
		zkLockSubject(),
	}
}

// selectSubjects picks subjects by id; "all" (or "") selects every one.
func selectSubjects(list string) ([]*subject, error) {
	all := subjects()
	if list == "" || list == "all" {
		return all, nil
	}
	byID := map[string]*subject{}
	for _, s := range all {
		byID[s.id] = s
	}
	want := map[string]bool{}
	for _, id := range strings.Split(list, ",") {
		id = strings.TrimSpace(id)
		if id == "" {
			continue
		}
		if byID[id] == nil {
			ids := make([]string, 0, len(all))
			for _, s := range all {
				ids = append(ids, s.id)
			}
			return nil, fmt.Errorf("unknown backend %q (known: %s)", id, strings.Join(ids, ", "))
		}
		want[id] = true
	}
	var out []*subject
	for _, s := range all {
		if want[s.id] {
			out = append(out, s)
		}
	}
	return out, nil
}
