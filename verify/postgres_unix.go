//go:build unix

package verify

import "github.com/dlock-go/dlock/internal/testserver"

// startLocalPostgres starts a throwaway PostgreSQL server and returns it
// with its address.
func startLocalPostgres() (serverNode, string, error) {
	p, err := testserver.StartPostgres(testserver.PostgresOptions{})
	if err != nil {
		return nil, "", err
	}
	return p, p.Addr(), nil
}
