//go:build !unix

package verify

import "errors"

// startLocalPostgres fails: the throwaway PostgreSQL server runs on Unix
// systems only.
func startLocalPostgres() (serverNode, string, error) {
	return nil, "", errors.New("a local PostgreSQL server (postgres://local) needs a Unix system")
}
