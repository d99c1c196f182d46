//go:build unix

package redislock

import (
	"errors"
	"io"
	"net"
	"syscall"
)

// checkIdle reports whether the server has closed (or written to) c, a
// connection on which no call waits, without blocking: it peeks at the
// socket. A connection that is not a plain socket passes: a TLS one (TLS
// 1.3 servers send session tickets unasked), or a dialer's wrapper.
func checkIdle(c net.Conn) error {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var peekErr error
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case n == 0 && err == nil:
			peekErr = io.EOF
		case n > 0:
			peekErr = errors.New("redislock: the server wrote to an idle connection")
		case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK || err == syscall.EINTR:
		default:
			peekErr = err
		}
		return true
	})
	if err != nil {
		return err
	}
	return peekErr
}
