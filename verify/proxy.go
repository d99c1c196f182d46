package verify

import (
	"errors"
	"net"
	"sync"
	"time"
)

// proxy is a TCP proxy on loopback between the workers and one lock
// server. Its faults: delay every chunk of data in both directions,
// blackhole (hold all data and new connections until healed, as a network
// partition does to TCP), and reset every connection.
type proxy struct {
	upstream string
	ln       net.Listener

	mu     sync.Mutex
	delay  time.Duration
	holed  chan struct{} // non-nil while blackholed; closed when healed
	conns  map[*proxyConn]struct{}
	closed bool
	wg     sync.WaitGroup
}

type proxyConn struct {
	client   net.Conn
	once     sync.Once
	done     chan struct{}
	mu       sync.Mutex
	upstream net.Conn // nil until dialled
}

func (c *proxyConn) close(reset bool) {
	c.once.Do(func() {
		c.mu.Lock()
		close(c.done)
		up := c.upstream
		c.mu.Unlock()
		if tc, ok := c.client.(*net.TCPConn); ok && reset {
			_ = tc.SetLinger(0) // close with RST
		}
		c.client.Close()
		if up != nil {
			up.Close()
		}
	})
}

// attach records the upstream connection; false (and up closed) if the
// pair already ended.
func (c *proxyConn) attach(up net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.done:
		up.Close()
		return false
	default:
		c.upstream = up
		return true
	}
}

func newProxy(upstream string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{upstream: upstream, ln: ln, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the address workers connect to.
func (p *proxy) Addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		pc := &proxyConn{client: c, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return
		}
		p.conns[pc] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(pc)
	}
}

func (p *proxy) serve(pc *proxyConn) {
	defer p.wg.Done()
	defer func() {
		pc.close(false)
		p.mu.Lock()
		delete(p.conns, pc)
		p.mu.Unlock()
	}()
	// A blackholed network does not complete new connections either.
	if !p.gate(pc) {
		return
	}
	up, err := net.DialTimeout("tcp", p.upstream, 2*time.Second)
	if err != nil {
		return
	}
	if !pc.attach(up) {
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pump(pc, up, pc.client) }()
	go func() { defer wg.Done(); p.pump(pc, pc.client, up) }()
	wg.Wait()
}

// pump copies src to dst through the proxy's faults until either side
// ends, then ends the connection pair.
func (p *proxy) pump(pc *proxyConn, dst, src net.Conn) {
	defer pc.close(false)
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate(pc) {
				return
			}
			if d := p.currentDelay(); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-pc.done:
					t.Stop()
					return
				}
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// gate waits while the proxy is blackholed; false if the connection ended.
func (p *proxy) gate(pc *proxyConn) bool {
	for {
		p.mu.Lock()
		h := p.holed
		p.mu.Unlock()
		if h == nil {
			select {
			case <-pc.done:
				return false
			default:
				return true
			}
		}
		select {
		case <-h:
		case <-pc.done:
			return false
		}
	}
}

func (p *proxy) currentDelay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay
}

// setDelay delays every chunk forwarded from now on by d (0: none).
func (p *proxy) setDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// blackhole holds (on) or releases (off) all traffic.
func (p *proxy) blackhole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case on && p.holed == nil:
		p.holed = make(chan struct{})
	case !on && p.holed != nil:
		close(p.holed)
		p.holed = nil
	}
}

// reset closes every open connection with a TCP RST and returns how many
// it closed.
func (p *proxy) reset() int {
	p.mu.Lock()
	conns := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.close(true)
	}
	return len(conns)
}

// heal ends every fault.
func (p *proxy) heal() {
	p.setDelay(0)
	p.blackhole(false)
}

// Close stops the proxy and waits for its goroutines.
func (p *proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.heal()
	p.reset()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
