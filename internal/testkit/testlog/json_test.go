package testlog

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestCheckJSONLine(t *testing.T) {
	for _, tc := range []struct {
		line string
		want string // "" when good
	}{
		{`{"level":"INFO","msg":"m","component":"ca"}`, ""},
		{`{"a":{"b":1,"c":[{"b":2},{"b":3}]},"b":1}`, ""},
		{`{}`, ""},
		{`{"component":"agent","msg":"m","component":"rotator"}`, `key "component" repeated in the record`},
		{`{"a":{"b":1,"b":2}}`, `key "b" repeated in .a`},
		{`{"a":[{"b":1,"b":2}]}`, `key "b" repeated in .a[]`},
		{`trustbridge is serving trust domain example.org`, "invalid character"},
		{`  admin:      http://127.0.0.1:1/healthz`, "invalid character"},
		{`[1]`, "not a JSON object"},
		{`{"a":1}{"b":2}`, "more than one JSON value"},
		{`{"a":1`, "EOF"},
		{``, "EOF"},
	} {
		t.Run(tc.line, func(t *testing.T) {
			err := CheckJSONLine([]byte(tc.line))
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

// A line written in pieces is checked once whole; a bad one fails the
// test at its end.
func TestJSONLines(t *testing.T) {
	inner := &testing.T{}
	ft := &fakeTB{T: inner}
	b := JSONLines(ft)
	_, _ = b.Write([]byte(`{"a":`))
	_, _ = b.Write([]byte("1}\n{\"b\":1,\"b\":2}\nbanner\n"))
	ft.cleanup()
	assert.Len(t, ft.errs, 2)
	assert.Equal(t, "{\"a\":1}\n{\"b\":1,\"b\":2}\nbanner\n", b.String(), "written as is")
}

func FuzzCheckJSONLine(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `{"a":{"b":[1,{"c":2}]}}`, `{"a":1,"a":2}`, `x`, `{"a":[`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		_ = CheckJSONLine(line) // never panics
	})
}

type fakeTB struct {
	*testing.T
	cleanups []func()
	errs     []string
}

func (f *fakeTB) Cleanup(fn func())                 { f.cleanups = append(f.cleanups, fn) }
func (f *fakeTB) Errorf(format string, args ...any) { f.errs = append(f.errs, format) }
func (f *fakeTB) cleanup() {
	for _, fn := range f.cleanups {
		fn()
	}
}
