package zklock

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dlock-go/dlock"
	"github.com/go-zookeeper/zk"
)

// DefaultPath is the znode under which locks live when WithPath is not
// given: the queue of key k is DefaultPath + "/" + the escaped k.
const DefaultPath = "/dlock"

// An Option configures a Backend (New, Connect). An invalid value is never
// corrected: Connect returns the error; New records it, Err returns it and
// every call of the Backend fails with it.
type Option func(*config) error

type config struct {
	path           string
	acl            []zk.ACL
	sessionTimeout time.Duration // New: the declared session timeout
	logger         zk.Logger     // Connect only
	dialer         zk.Dialer     // Connect only
	connOpts       []func(*zk.Conn)
}

func defaultConfig() config {
	return config{path: DefaultPath, acl: zk.WorldACL(zk.PermAll)}
}

func (c *config) apply(opts []Option) error {
	for _, o := range opts {
		if o == nil {
			return fmt.Errorf("zklock: %w: nil Option", dlock.ErrInvalidOption)
		}
		if err := o(c); err != nil {
			return err
		}
	}
	return nil
}

// WithPath sets the znode under which locks live. Default DefaultPath
// ("/dlock"). The path must be absolute, must not end with "/", must not
// be "/" itself or lie under "/zookeeper", and every component must be a
// valid znode name (no "." or "..", no control characters). Missing
// components are created as empty persistent znodes on first use. Other
// values are an ErrInvalidOption error.
func WithPath(path string) Option {
	return func(c *config) error {
		if err := validRoot(path); err != nil {
			return err
		}
		c.path = path
		return nil
	}
}

// WithACL sets the ACL of every znode the Backend creates (parents and lock
// nodes). Default zk.WorldACL(zk.PermAll). An empty list is an
// ErrInvalidOption error.
func WithACL(acl ...zk.ACL) Option {
	return func(c *config) error {
		if len(acl) == 0 {
			return fmt.Errorf("zklock: %w: empty ACL", dlock.ErrInvalidOption)
		}
		c.acl = append([]zk.ACL(nil), acl...)
		return nil
	}
}

// WithSessionTimeout declares, for New, the session timeout the server
// negotiated for the connection (go-zookeeper does not expose it). Without
// it a Backend from New refuses every TTL. Connect rejects it. A value ≤ 0
// is an ErrInvalidOption error.
func WithSessionTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("zklock: %w: session timeout %v must be positive", dlock.ErrInvalidOption, d)
		}
		c.sessionTimeout = d
		return nil
	}
}

// WithLogger sets, for Connect, the logger of the go-zookeeper connection.
// Default zk.DefaultLogger (the standard log package). New ignores it: the
// connection already exists. A nil logger is an ErrInvalidOption error.
func WithLogger(l zk.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("zklock: %w: nil logger", dlock.ErrInvalidOption)
		}
		c.logger = l
		return nil
	}
}

// WithDialer sets, for Connect, how the connection dials a server.
// Default net.DialTimeout. Connect wraps the dialer to read the session
// timeout the server negotiates; a zk.WithDialer given through
// WithConnOptions would bypass that and is replaced. New ignores it. A nil
// dialer is an ErrInvalidOption error.
func WithDialer(d zk.Dialer) Option {
	return func(c *config) error {
		if d == nil {
			return fmt.Errorf("zklock: %w: nil dialer", dlock.ErrInvalidOption)
		}
		c.dialer = d
		return nil
	}
}

// WithConnOptions passes go-zookeeper connection options (zk.WithLogInfo,
// zk.WithMaxBufferSize, zk.WithHostProvider, ...) to zk.Connect in Connect.
// Default none. They are applied before the Backend's own options, so a
// zk.WithDialer or zk.WithLogger among them is replaced (use WithDialer and
// WithLogger). New ignores them. A nil option is an ErrInvalidOption error.
func WithConnOptions(opts ...func(*zk.Conn)) Option {
	return func(c *config) error {
		for _, o := range opts {
			if o == nil {
				return fmt.Errorf("zklock: %w: nil connection option", dlock.ErrInvalidOption)
			}
		}
		c.connOpts = append(c.connOpts, opts...)
		return nil
	}
}

// validRoot checks a WithPath value.
func validRoot(path string) error {
	bad := func(why string) error {
		return fmt.Errorf("zklock: %w: path %q: %s", dlock.ErrInvalidOption, path, why)
	}
	switch {
	case !strings.HasPrefix(path, "/"):
		return bad("must be absolute")
	case path == "/":
		return bad("must not be the root")
	case strings.HasSuffix(path, "/"):
		return bad(`must not end with "/"`)
	case path == "/zookeeper" || strings.HasPrefix(path, "/zookeeper/"):
		return bad("/zookeeper is reserved")
	}
	for _, part := range strings.Split(path[1:], "/") {
		switch part {
		case "":
			return bad("empty component")
		case ".", "..":
			return bad(`"." and ".." are not znode names`)
		}
		for _, r := range part {
			if !validZnodeRune(r) {
				return bad(fmt.Sprintf("character %U is not allowed in a znode name", r))
			}
		}
		if !utf8.ValidString(part) {
			return bad("not valid UTF-8")
		}
	}
	return nil
}

// validZnodeRune reports whether ZooKeeper accepts r in a path (its
// PathUtils.validatePath rejects these ranges).
func validZnodeRune(r rune) bool {
	switch {
	case r == utf8.RuneError:
		return false
	case r <= 0x1f, r >= 0x7f && r <= 0x9f:
		return false
	case r >= 0xd800 && r <= 0xf8ff, r >= 0xfff0 && r <= 0xffff:
		return false
	}
	return true
}
