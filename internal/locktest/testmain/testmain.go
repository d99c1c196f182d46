// Package testmain runs a test binary whose tests share servers: after the
// tests it stops the servers, then looks for leaked goroutines with goleak
// (the servers' own goroutines are gone by then).
package testmain

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Run runs the tests of m, calls stop, and, when both succeeded, fails the
// binary if goroutines leaked (goleak, with opts). It exits the process
// with the tests' code, or 1 when stop or goleak failed; name prefixes the
// messages it prints.
func Run(m *testing.M, name string, stop func() error, opts ...goleak.Option) {
	goleak.VerifyTestMain(stopAfter{m, name, stop}, opts...)
}

// stopAfter is a goleak.TestingM that calls stop after the tests.
type stopAfter struct {
	m    *testing.M
	name string
	stop func() error
}

// Run runs the tests, then stop; it returns the tests' exit code, or 1
// when they passed and stop failed.
func (s stopAfter) Run() int {
	code := s.m.Run()
	if err := s.stop(); err != nil {
		fmt.Fprintf(os.Stderr, "%s tests: stop servers: %v\n", s.name, err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Fail prints err prefixed with name and exits with code 1: a TestMain
// whose servers did not start.
func Fail(name string, err error) {
	fmt.Fprintf(os.Stderr, "%s tests: %v\n", name, err)
	os.Exit(1)
}
