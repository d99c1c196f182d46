package testserver

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Partitionable deployments run every member in its own Linux network
// namespace, attached by a veth pair to a bridge in the caller's namespace
// that has the address 10.213.S.1/24; member i listens on 10.213.S.(i+2).
// Clients in the caller's namespace reach every member through the bridge,
// members reach each other through it too, so taking the bridge side of
// member i's veth pair down cuts i off from everyone — the other members
// and every client — without touching its process: a symmetric network
// partition, and putting the link up again heals it. Neither nftables nor
// tc netem is needed, only the ip command (iproute2) and root.
//
// The bridge, the veth pairs and the namespaces carry this process's id in
// their names (dk<pid in base 36><n>...); Stop removes them. A process
// killed before Stop leaves them behind: `ip netns list` and `ip link`
// show them, `ip netns del` and `ip link del` remove them.

// ErrNoNetNS is matched (errors.Is) by the error of a partitionable Start
// function on a machine where network namespaces cannot be created: not
// Linux, not root, or no ip command.
var ErrNoNetNS = errors.New("testserver: network namespaces unavailable")

var netLabSeq atomic.Int64

// netLab is a bridge with one network namespace per member.
type netLab struct {
	ipBin  string
	prefix string // interface and namespace name prefix, ≤ 10 characters
	subnet string // "10.213.S"
	n      int

	mu  sync.Mutex
	cut map[int]bool
}

// NetNSAvailable returns nil if partitionable deployments can be started
// here, else an error matching ErrNoNetNS that says why.
func NetNSAvailable() error {
	if runtime.GOOS != "linux" {
		return fmt.Errorf("%w: needs Linux", ErrNoNetNS)
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: needs root", ErrNoNetNS)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("%w: no ip command in PATH (apt-get install -y iproute2)", ErrNoNetNS)
	}
	return nil
}

// newNetLab creates the bridge and n namespaces with their veth pairs.
func newNetLab(n int) (_ *netLab, err error) {
	if err := NetNSAvailable(); err != nil {
		return nil, err
	}
	ipBin, _ := exec.LookPath("ip")
	seq := netLabSeq.Add(1)
	l := &netLab{ipBin: ipBin, prefix: "dk" + strconv.FormatInt(int64(os.Getpid()), 36) + strconv.FormatInt(seq, 36), n: n, cut: map[int]bool{}}
	if l.subnet, err = freeSubnet(ipBin, int(seq)); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, l.close())
		}
	}()
	br := l.prefix + "b"
	cmds := [][]string{
		{"link", "add", br, "type", "bridge"},
		{"addr", "add", l.subnet + ".1/24", "dev", br},
		{"link", "set", br, "up"},
	}
	for i := range n {
		ns, host, peer := l.ns(i), l.hostVeth(i), l.prefix+"n"+strconv.Itoa(i)
		cmds = append(cmds,
			[]string{"netns", "add", ns},
			[]string{"link", "add", host, "type", "veth", "peer", "name", peer},
			[]string{"link", "set", peer, "netns", ns},
			[]string{"link", "set", host, "master", br, "up"},
			[]string{"-n", ns, "addr", "add", l.IP(i) + "/24", "dev", peer},
			[]string{"-n", ns, "link", "set", peer, "up"},
			[]string{"-n", ns, "link", "set", "lo", "up"},
		)
	}
	for _, c := range cmds {
		if err := l.ip(c...); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// freeSubnet returns a 10.213.S prefix no interface here uses yet.
func freeSubnet(ipBin string, seq int) (string, error) {
	out, err := exec.Command(ipBin, "-o", "-4", "addr", "show").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("testserver: ip addr show: %v: %s", err, out)
	}
	for k := range 250 {
		s := fmt.Sprintf("10.213.%d", 1+(os.Getpid()*7+seq*13+k)%250)
		if !strings.Contains(string(out), " "+s+".") {
			return s, nil
		}
	}
	return "", errors.New("testserver: no free 10.213.S.0/24 subnet")
}

func (l *netLab) ip(args ...string) error {
	if out, err := exec.Command(l.ipBin, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("testserver: ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (l *netLab) ns(i int) string       { return l.prefix + "-" + strconv.Itoa(i) }
func (l *netLab) hostVeth(i int) string { return l.prefix + "h" + strconv.Itoa(i) }

// IP returns member i's address.
func (l *netLab) IP(i int) string { return l.subnet + "." + strconv.Itoa(i+2) }

// wrap returns the argv prefix that runs a command in member i's namespace.
func (l *netLab) wrap(i int) []string { return []string{"netns", "exec", l.ns(i)} }

// setCut takes member i's link down (cut) or up (heal).
func (l *netLab) setCut(i int, cut bool) error {
	if i < 0 || i >= l.n {
		return fmt.Errorf("testserver: no member %d", i)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	state := "up"
	if cut {
		state = "down"
	}
	if err := l.ip("link", "set", l.hostVeth(i), state); err != nil {
		return err
	}
	l.cut[i] = cut
	return nil
}

// close deletes the veth pairs, the namespaces and the bridge. It
// tolerates parts that were never created.
func (l *netLab) close() error {
	var errs []error
	for i := range l.n {
		// Deleting a namespace frees its end of the pair only when the
		// kernel gets round to it; delete the pair at once.
		if _, err := os.Stat(filepath.Join("/sys/class/net", l.hostVeth(i))); err == nil {
			errs = append(errs, l.ip("link", "del", l.hostVeth(i)))
		}
		if _, err := os.Stat(filepath.Join("/run/netns", l.ns(i))); err == nil {
			errs = append(errs, l.ip("netns", "del", l.ns(i)))
		}
	}
	if _, err := os.Stat(filepath.Join("/sys/class/net", l.prefix+"b")); err == nil {
		errs = append(errs, l.ip("link", "del", l.prefix+"b"))
	}
	return errors.Join(errs...)
}

// partitions gives the partitionable topologies their Partition and Heal
// methods over the nodes of their namespaces.
type partitions struct{ lab *netLab }

// Partition cuts node i (a member, server or data node) off from the other
// nodes and from every client (its link goes down); Heal(i) ends it.
func (p *partitions) Partition(i int) error { return p.lab.setCut(i, true) }

// Heal ends the partition of node i.
func (p *partitions) Heal(i int) error { return p.lab.setCut(i, false) }

// PartitionableEtcdCluster is an [EtcdCluster] whose members each run in
// their own network namespace (see the comment above ErrNoNetNS), so one
// can be cut off from the others and from every client.
//
// Its methods are safe for concurrent use.
type PartitionableEtcdCluster struct {
	*EtcdCluster
	partitions
}

// StartPartitionableEtcdCluster starts n etcd members, member i in its own
// namespace at 10.213.S.(i+2), and returns once every member reports
// healthy. It fails with an error matching ErrNoNetNS where namespaces
// cannot be created. On error it stops what it started and removes the
// namespaces.
func StartPartitionableEtcdCluster(n int) (*PartitionableEtcdCluster, error) {
	if n <= 0 {
		return nil, fmt.Errorf("testserver: StartPartitionableEtcdCluster: invalid n %d: must be positive", n)
	}
	bin, err := lookPath("etcd", "etcd-server")
	if err != nil {
		return nil, err
	}
	lab, err := newNetLab(n)
	if err != nil {
		return nil, err
	}
	c, err := startEtcdIn(lab, bin)
	if err != nil {
		return nil, errors.Join(err, lab.close())
	}
	return &PartitionableEtcdCluster{EtcdCluster: c, partitions: partitions{lab}}, nil
}

func startEtcdIn(lab *netLab, bin string) (_ *EtcdCluster, err error) {
	const clientPort, peerPort = 2379, 2380 // each namespace has its own
	c := &EtcdCluster{members: make([]*Etcd, lab.n)}
	defer func() {
		if err != nil {
			_ = c.Stop()
		}
	}()
	for i := range c.members {
		c.members[i] = &Etcd{host: lab.IP(i), name: fmt.Sprintf("m%d", i), clientPort: clientPort, peerPort: peerPort}
	}
	err = c.prepare(bin, DefaultStartTimeout, func(i int, s *server) {
		s.name += " in " + lab.ns(i)
		s.args = append(append(lab.wrap(i), s.bin), s.args...)
		s.bin = lab.ipBin
		// No ports: the listeners live in another namespace, which
		// /proc/net/tcp here does not show; health answers instead.
		s.ports = nil
	})
	if err != nil {
		return nil, err
	}
	if err := launchAll(c.members, func(m *Etcd) *server { return m.srv }); err != nil {
		return nil, err
	}
	return c, nil
}

// launchAll launches every member's process, then waits for all of them
// concurrently: none can be ready before a quorum runs, and a member that
// exits ends every wait at once.
func launchAll[T any](members []T, srv func(T) *server) error {
	for _, m := range members {
		if err := srv(m).launch(); err != nil {
			return err
		}
	}
	procs := make([]*proc, len(members))
	for i, m := range members {
		procs[i] = srv(m).p
	}
	errs := make([]error, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		wg.Go(func() {
			s := srv(m)
			errs[i] = s.awaitReadyWith(func() error {
				for j, p := range procs {
					if j != i && p.exited() {
						return abort(fmt.Errorf("member %d exited", j))
					}
				}
				return s.ready()
			})
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Stop kills every member (see [EtcdCluster.Stop]) and removes the
// namespaces and the bridge. It is idempotent and safe on a nil receiver.
func (c *PartitionableEtcdCluster) Stop() error {
	if c == nil {
		return nil
	}
	return errors.Join(c.EtcdCluster.Stop(), c.lab.close())
}

// PartitionableZooKeeperEnsemble is a [ZooKeeperEnsemble] whose servers
// each run in their own network namespace (see the comment above
// ErrNoNetNS).
//
// Its methods are safe for concurrent use.
type PartitionableZooKeeperEnsemble struct {
	*ZooKeeperEnsemble
	partitions
}

// StartPartitionableZooKeeperEnsemble starts n ZooKeeper servers with
// opts.TickTime, server i in its own namespace at 10.213.S.(i+2), and
// returns once every one accepts a session (bounded by opts.StartTimeout,
// or 60 s). It fails with an error matching ErrNoNetNS where namespaces
// cannot be created. On error it stops what it started and removes the
// namespaces.
func StartPartitionableZooKeeperEnsemble(n int, opts ZooKeeperOptions) (*PartitionableZooKeeperEnsemble, error) {
	if n <= 0 {
		return nil, fmt.Errorf("testserver: StartPartitionableZooKeeperEnsemble: invalid n %d: must be positive", n)
	}
	lab, err := newNetLab(n)
	if err != nil {
		return nil, err
	}
	e, err := startEnsemble(n, opts, lab)
	if err != nil {
		return nil, errors.Join(err, lab.close())
	}
	return &PartitionableZooKeeperEnsemble{ZooKeeperEnsemble: e, partitions: partitions{lab}}, nil
}

// Stop stops every server (see [ZooKeeperEnsemble.Stop]) and removes the
// namespaces and the bridge. It is idempotent and safe on a nil receiver.
func (e *PartitionableZooKeeperEnsemble) Stop() error {
	if e == nil {
		return nil
	}
	return errors.Join(e.ZooKeeperEnsemble.Stop(), e.lab.close())
}
