package resp

import (
	"bufio"
	"reflect"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	for _, tc := range []struct {
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
	} {
		got, err := Read(bufio.NewReader(strings.NewReader(tc.in)))
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Read(%q) = %#v, %v; want %#v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "+OK", "+OK\n", "?x\r\n", ":x\r\n", "$-2\r\n", "$3\r\nab", "*2\r\n:1\r\n"} {
		if got, err := Read(bufio.NewReader(strings.NewReader(in))); err == nil {
			t.Errorf("Read(%q) = %#v, nil error; want an error", in, got)
		}
	}
}

func TestAppendCommand(t *testing.T) {
	got := string(AppendCommand([]byte("x"), "SET", "k", ""))
	if want := "x*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"; got != want {
		t.Fatalf("AppendCommand = %q, want %q", got, want)
	}
}
