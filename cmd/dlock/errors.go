package main

import (
	"errors"
	"fmt"
	"strings"
)

// Exit codes. The conflict and lost codes of `dlock run` can be changed by
// flags; a command's own exit code is passed through unchanged.
const (
	exitOK          = 0
	exitFailure     = 1  // the operation failed (release refused, demo part failed, ...)
	exitUsage       = 2  // bad flags, arguments or backend URL
	exitUnavailable = 2  // the lock server could not be reached, did not answer or refused the connection: bad input like a wrong URL, told apart by the message
	exitNoLeader    = 3  // leader show: the election has no leader
	exitConflict    = 75 // default --conflict-exit-code: lock held elsewhere (EX_TEMPFAIL, like flock -E)
	exitLost        = 76 // default --lost-exit-code: the lease was lost while the command ran
	exitNoExec      = 127
	exitNoPerm      = 126
)

// exitError carries a command's exit code to main. Its message is printed
// on stderr unless it is empty.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return ""
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// exitWith returns an error that makes dlock exit with code, printing
// err (nil prints nothing).
func exitWith(code int, err error) error { return &exitError{code: code, err: err} }

// usageError is a mistake in the command line: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// exitCode maps an error returned by a command to the process exit code:
// an *exitError carries its own, everything else (cobra's flag and
// argument errors, usageError) is a usage error.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return exitUsage
}

// message formats err for stderr: one "dlock: " prefix, on one line
// (errors joined with errors.Join are separated by "; ").
func message(err error) string {
	s := err.Error()
	if s == "" {
		return ""
	}
	return "dlock: " + strings.ReplaceAll(strings.TrimPrefix(s, "dlock: "), "\n", "; ")
}
