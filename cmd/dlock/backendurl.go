package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/verify"
)

// defaultBackend is used when neither --backend nor DLOCK_BACKEND is set.
const defaultBackend = "redis://127.0.0.1:6379"

// schemes lists the --backend URL schemes with their default port, in the
// order the help text shows them.
var schemes = []struct {
	name string
	port int
	form string
}{
	{"redis", 6379, "redis://[user:password@]host[:port][/db]"},
	{"rediss", 6379, "rediss://[user:password@]host[:port][/db]  (TLS)"},
	{"redis+sentinel", 26379, "redis+sentinel://[user:password@]h1[:port],h2,.../master[?db=N]"},
	{"redis+cluster", 6379, "redis+cluster://[user:password@]h1[:port],h2,..."},
	{"redlock", 6379, "redlock://[user:password@]h1[:port],h2,h3,...[/db][?node_timeout=50ms]  (3, 5, 7... independent nodes)"},
	{"etcd", 2379, "etcd://[user:password@]h1[:port],h2,...[/prefix]"},
	{"zk", 2181, "zk://h1[:port],h2,...[/path]"},
	{"postgres", 5432, "postgres://[user:password@]h1[:port],h2,.../database[?mode=session&schema=dlock&notify_host=h&sslmode=...]"},
}

func schemeNames() string {
	names := make([]string, len(schemes))
	for i, s := range schemes {
		names[i] = s.name
	}
	return strings.Join(names, ", ")
}

// backendSpec is a parsed --backend URL.
type backendSpec struct {
	raw      string     // as given
	scheme   string     // one of schemes
	user     string     // from the userinfo, may be empty
	password string     // from the userinfo, may be empty
	hosts    []string   // "host:port", default port filled in, never empty
	path     string     // without the leading "/", may be empty
	query    url.Values // never nil
}

// redacted returns the URL with its password replaced, for messages.
func (s *backendSpec) redacted() string { return verify.RedactURL(s.raw) }

// parseBackendURL parses a --backend URL. Errors are usage errors naming
// the URL (password redacted) and what is wrong with it.
func parseBackendURL(raw string) (*backendSpec, error) {
	spec, err := splitBackendURL(raw)
	if err == nil {
		err = spec.check()
	}
	if err != nil {
		return nil, usageErrorf("invalid backend URL %q: %s", verify.RedactURL(raw), err)
	}
	return spec, nil
}

// splitBackendURL splits raw into scheme, credentials, hosts (with the
// scheme's default port where none is given), path and query.
func splitBackendURL(raw string) (*backendSpec, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, fmt.Errorf("want SCHEME://HOSTS..., with SCHEME one of %s", schemeNames())
	}
	scheme = strings.ToLower(scheme)
	defPort := 0
	for _, s := range schemes {
		if s.name == scheme {
			defPort = s.port
		}
	}
	if defPort == 0 {
		return nil, fmt.Errorf("unknown scheme %q (known: %s)", scheme, schemeNames())
	}

	// Split authority / path / query by hand: url.Parse rejects host lists
	// such as "h1:6379,h2:6379".
	auth, tail := rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		auth, tail = rest[:i], rest[i:]
	}
	spec := &backendSpec{raw: raw, scheme: scheme}
	if at := strings.LastIndex(auth, "@"); at >= 0 {
		ui := auth[:at]
		auth = auth[at+1:]
		u, p, _ := strings.Cut(ui, ":")
		var err error
		if spec.user, err = url.PathUnescape(u); err != nil {
			return nil, fmt.Errorf("malformed user name: %v", err)
		}
		if spec.password, err = url.PathUnescape(p); err != nil {
			return nil, errors.New("malformed password")
		}
	}
	if auth == "" {
		return nil, errors.New("no host")
	}
	for _, h := range strings.Split(auth, ",") {
		hp, err := hostPort(h, defPort)
		if err != nil {
			return nil, err
		}
		spec.hosts = append(spec.hosts, hp)
	}
	u, err := url.Parse("x://h" + tail)
	if err != nil {
		return nil, err
	}
	if u.Fragment != "" {
		return nil, fmt.Errorf("unexpected fragment #%s", u.Fragment)
	}
	spec.path = strings.TrimPrefix(u.Path, "/")
	spec.query = u.Query()
	return spec, nil
}

// check returns an error if s's hosts, path, query or credentials do not
// fit its scheme.
func (s *backendSpec) check() error {
	switch s.scheme {
	case "redis", "rediss":
		if len(s.hosts) != 1 {
			return fmt.Errorf("%s:// takes one host, got %d (use redis+cluster://, redis+sentinel:// or redlock:// for several)", s.scheme, len(s.hosts))
		}
		_, err := dbNumber(s.path)
		return err
	case "redis+sentinel":
		if s.path == "" || strings.Contains(s.path, "/") {
			return errors.New("want the master name as the path: redis+sentinel://h1,h2/MASTER")
		}
		if db := s.query.Get("db"); db != "" {
			_, err := dbNumber(db)
			return err
		}
	case "redis+cluster":
		if s.path != "" {
			return fmt.Errorf("%s:// takes no path, got /%s", s.scheme, s.path)
		}
	case "redlock":
		return s.checkRedlock()
	case "zk":
		if s.user != "" || s.password != "" {
			return errors.New("zk:// takes no user or password")
		}
	}
	return nil
}

// checkRedlock returns an error unless s names an odd number (at least 3)
// of distinct nodes, a valid db and no query parameter but node_timeout.
func (s *backendSpec) checkRedlock() error {
	if _, err := dbNumber(s.path); err != nil {
		return err
	}
	if n := len(s.hosts); n < 3 || n%2 == 0 {
		return fmt.Errorf("redlock:// needs an odd number of independent nodes, at least 3; got %d", n)
	}
	seen := map[string]bool{}
	for _, h := range s.hosts {
		if seen[h] {
			return fmt.Errorf("node %s appears twice", h)
		}
		seen[h] = true
	}
	for k := range s.query {
		if k != "node_timeout" {
			return fmt.Errorf("unknown query parameter %q (known: node_timeout)", k)
		}
	}
	if v := s.query.Get("node_timeout"); v != "" {
		if d, err := time.ParseDuration(v); err != nil || d <= 0 {
			return fmt.Errorf("node_timeout %q is not a positive duration", v)
		}
	}
	return nil
}

// hostPort validates one entry of a host list and adds the default port.
func hostPort(h string, defPort int) (string, error) {
	if h == "" {
		return "", fmt.Errorf("empty host in the host list")
	}
	host, port := h, strconv.Itoa(defPort)
	if strings.HasPrefix(h, "[") || strings.Count(h, ":") == 1 {
		var err error
		host, port, err = net.SplitHostPort(h)
		if err != nil {
			if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") { // "[::1]"
				host, port = h[1:len(h)-1], strconv.Itoa(defPort)
			} else {
				return "", fmt.Errorf("malformed host %q: %v", h, err)
			}
		}
	} else if strings.Contains(h, ":") {
		return "", fmt.Errorf("malformed host %q: write IPv6 addresses as [addr]:port", h)
	}
	if host == "" {
		return "", fmt.Errorf("malformed host %q: empty host name", h)
	}
	if strings.ContainsAny(host, " \t/\\@?#%") {
		return "", fmt.Errorf("malformed host %q", h)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("malformed host %q: port %q is not a number in 1..65535", h, port)
	}
	return net.JoinHostPort(host, port), nil
}

// dbNumber parses a Redis database number ("" is 0).
func dbNumber(s string) (int, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("database %q is not a number >= 0", s)
	}
	return n, nil
}
