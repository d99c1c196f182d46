package resp

import (
	"bufio"
	"reflect"
	"strings"
	"testing"
)

var replies = []struct {
	in   string
	want any
}{
	{"+OK\r\n", "OK"},
	{"-ERR no\r\n", Error("ERR no")},
	{":-42\r\n", int64(-42)},
	{"$5\r\nhe\r\nl\r\n", "he\r\nl"},
	{"$0\r\n\r\n", ""},
	{"$-1\r\n", nil},
	{"*-1\r\n", nil},
	{"*0\r\n", []any{}},
	{"*4\r\n:1\r\n$-1\r\n-NOSCRIPT x\r\n*1\r\n+a\r\n", []any{int64(1), nil, Error("NOSCRIPT x"), []any{"a"}}},
}

// malformed are never a reply (Read fails at the end of the input too).
var malformed = []string{"?x\r\n", ":x\r\n", "$-2\r\n", "*-3\r\n", "+OK\n"}

func TestRead(t *testing.T) {
	for _, tc := range replies {
		got, err := Read(bufio.NewReader(strings.NewReader(tc.in)))
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Read(%q) = %#v, %v; want %#v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range append([]string{"", "+OK", "$3\r\nab", "*2\r\n:1\r\n"}, malformed...) {
		if got, err := Read(bufio.NewReader(strings.NewReader(in))); err == nil {
			t.Errorf("Read(%q) = %#v, nil error; want an error", in, got)
		}
	}
}

func TestParse(t *testing.T) {
	for _, tc := range replies {
		in := tc.in + ":7\r\n" // the next reply is left alone
		got, n, err := Parse([]byte(in))
		if err != nil || n != len(tc.in) || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Parse(%q) = %#v, %d, %v; want %#v, %d", in, got, n, err, tc.want, len(tc.in))
		}
		for i := range len(tc.in) {
			if got, n, err := Parse([]byte(tc.in[:i])); n != 0 || err != nil {
				t.Errorf("Parse(%q) = %#v, %d, %v; want 0 bytes (incomplete)", tc.in[:i], got, n, err)
			}
		}
	}
	for _, in := range malformed {
		if got, _, err := Parse([]byte(in)); err == nil {
			t.Errorf("Parse(%q) = %#v, nil error; want an error", in, got)
		}
	}
}

func TestAppendCommand(t *testing.T) {
	got := string(AppendCommand([]byte("x"), "SET", "k", ""))
	if want := "x*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"; got != want {
		t.Fatalf("AppendCommand = %q, want %q", got, want)
	}
}
