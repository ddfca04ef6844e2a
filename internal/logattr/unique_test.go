package logattr

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestUniqueKeys(t *testing.T) {
	for _, tc := range []struct {
		name string
		log  func(*slog.Logger)
		want string
	}{
		{"With twice", func(l *slog.Logger) {
			l.With(Component, "agent").With(Component, "rotator").Info("m", "k", 1)
		}, `{"level":"INFO","msg":"m","component":"rotator","k":1}`},
		{"With and the call", func(l *slog.Logger) {
			l.With(TrustDomain, "a.example", "x", 1).Info("m", TrustDomain, "b.example")
		}, `{"level":"INFO","msg":"m","trust_domain":"b.example","x":1}`},
		{"twice in the call", func(l *slog.Logger) { l.Info("m", "k", 1, "k", 2) }, `{"level":"INFO","msg":"m","k":2}`},
		{"groups do not collide", func(l *slog.Logger) {
			l.With("k", 1).WithGroup("g").With("k", 2).Info("m", "k", 3)
		}, `{"level":"INFO","msg":"m","k":1,"g":{"k":3}}`},
		{"inline groups are flattened", func(l *slog.Logger) {
			l.Info("m", slog.Group("", "a", 1), slog.Group("", "b", 2))
		}, `{"level":"INFO","msg":"m","a":1,"b":2}`},
		{"an inline group's key replaces a With", func(l *slog.Logger) {
			l.With("k", 1).Info("m", slog.Group("", "k", 2))
		}, `{"level":"INFO","msg":"m","k":2}`},
		{"empty attributes are dropped", func(l *slog.Logger) { l.Info("m", slog.Attr{}, "k", 1) }, `{"level":"INFO","msg":"m","k":1}`},
		{"an empty group replaces nothing", func(l *slog.Logger) {
			l.With(slog.Group("g", "a", 1)).Info("m", slog.Group("g"))
		}, `{"level":"INFO","msg":"m","g":{"a":1}}`},
		{"the parent logger is unchanged", func(l *slog.Logger) {
			parent := l.With("k", 1)
			_ = parent.With("k", 2)
			parent.Info("m")
		}, `{"level":"INFO","msg":"m","k":1}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			h := slog.NewJSONHandler(&buf, &slog.HandlerOptions{ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey && len(groups) == 0 {
					return slog.Attr{}
				}
				return a
			}})
			tc.log(slog.New(UniqueKeys(h)))
			assert.JSONEq(t, tc.want, buf.String())
			assert.Equal(t, tc.want+"\n", buf.String(), "key order kept")
		})
	}
}
