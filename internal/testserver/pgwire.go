package testserver

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

// PGSession is a session as user postgres on database postgres of a
// throwaway server, speaking PostgreSQL's simple query protocol: enough
// for tests to run SQL on a real server without a driver.
type PGSession struct {
	conn  net.Conn
	r     *bufio.Reader
	first string // the first column of the first row of the last query
	got   bool   // a row was read
}

// DialPG opens a session on the server at addr; every exchange of it must
// end within timeout of the dial.
func DialPG(addr string, timeout time.Duration) (*PGSession, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	_ = conn.SetDeadline(time.Now().Add(timeout))
	var body bytes.Buffer
	_ = binary.Write(&body, binary.BigEndian, int32(196608)) // protocol 3.0
	body.WriteString("user\x00postgres\x00database\x00postgres\x00\x00")
	msg := binary.BigEndian.AppendUint32(nil, uint32(body.Len()+4))
	if _, err := conn.Write(append(msg, body.Bytes()...)); err != nil {
		conn.Close()
		return nil, err
	}
	s := &PGSession{conn: conn, r: bufio.NewReader(conn)}
	if _, err := s.await(); err != nil {
		conn.Close()
		return nil, err
	}
	return s, nil
}

// Exec runs sql (one or more statements) and returns the last command
// tag, such as "UPDATE 1", or the server's error.
func (s *PGSession) Exec(sql string) (string, error) {
	tag, _, err := s.query(sql)
	return tag, err
}

// Query runs sql and returns the first column of the first row it
// returns ("" when there is none), or the server's error.
func (s *PGSession) Query(sql string) (string, error) {
	_, first, err := s.query(sql)
	return first, err
}

func (s *PGSession) query(sql string) (tag, first string, err error) {
	q := append([]byte(sql), 0)
	msg := append([]byte{'Q'}, binary.BigEndian.AppendUint32(nil, uint32(len(q)+4))...)
	if _, err := s.conn.Write(append(msg, q...)); err != nil {
		return "", "", err
	}
	s.first, s.got = "", false
	tag, err = s.await()
	return tag, s.first, err
}

// Close ends the session.
func (s *PGSession) Close() error {
	_, _ = s.conn.Write([]byte{'X', 0, 0, 0, 4})
	return s.conn.Close()
}

// await reads messages up to ReadyForQuery and returns the last command
// tag or the server's error.
func (s *PGSession) await() (string, error) {
	var tag string
	var qerr error
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(s.r, hdr[:]); err != nil {
			return "", err
		}
		n := int(binary.BigEndian.Uint32(hdr[1:])) - 4
		if n < 0 || n > 1<<20 {
			return "", fmt.Errorf("postgres: bad message length %d", n)
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(s.r, body); err != nil {
			return "", err
		}
		switch hdr[0] {
		case 'C':
			tag = string(bytes.TrimRight(body, "\x00"))
		case 'D':
			if !s.got && len(body) >= 6 && binary.BigEndian.Uint16(body) > 0 {
				if n := int32(binary.BigEndian.Uint32(body[2:])); n >= 0 && int(n) <= len(body)-6 {
					s.first = string(body[6 : 6+n])
				}
				s.got = true
			}
		case 'E':
			qerr = fmt.Errorf("postgres: %s", bytes.ReplaceAll(body, []byte{0}, []byte{' '}))
		case 'Z':
			return tag, qerr
		}
	}
}
