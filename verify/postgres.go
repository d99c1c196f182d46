package verify

import (
	"fmt"
	"net/url"
	"strings"
)

// pgLocalDatabase is the database of a throwaway PostgreSQL server: the
// one initdb creates.
const pgLocalDatabase = "postgres"

// startPostgres starts the throwaway PostgreSQL server of
// "postgres://local[/postgres][?query]" and returns it with the URL the
// workers use: user postgres (trust authentication on loopback), database
// postgres, sslmode=disable, and the local URL's query parameters (such
// as mode=session) kept. The server survives Kill and Restart with its
// data (every committed transaction is in the write-ahead log): a restart
// ends every session, and with them every session advisory lock, while
// the lease table and the fence sequence come back.
func startPostgres(u backendURL) (*lockServers, error) {
	path, query, _ := strings.Cut(u.tail, "?")
	if db := strings.Trim(path, "/"); db != "" && db != pgLocalDatabase {
		return nil, invalid("backend URL %q: the local server has only the database %q", RedactURL(u.raw), pgLocalDatabase)
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, invalid("backend URL %q: %v", RedactURL(u.raw), err)
	}
	if !q.Has("sslmode") {
		q.Set("sslmode", "disable")
	}
	p, addr, err := startLocalPostgres()
	if err != nil {
		return nil, fmt.Errorf("verify: start postgres: %w", err)
	}
	return &lockServers{
		nodes: []serverNode{p},
		addrs: []string{addr},
		url:   "postgres://postgres@" + addr + "/" + pgLocalDatabase + "?" + q.Encode(),
	}, nil
}
