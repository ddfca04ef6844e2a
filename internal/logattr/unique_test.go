package logattr

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

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
		{"distinct keys pass through after the logger's", func(l *slog.Logger) {
			l.With("a", 1).With("b", 2).Info("m", "c", 3, "d", 4)
		}, `{"level":"INFO","msg":"m","a":1,"b":2,"c":3,"d":4}`},
		{"more attributes than the fast path checks, one repeated", func(l *slog.Logger) {
			args := []any{"k", 0}
			for i := range maxFastKeys {
				args = append(args, fmt.Sprintf("k%02d", i), i)
			}
			l.With("k", -1).Info("m", append(args, "k", 1)...)
		}, `{"level":"INFO","msg":"m","k":1,"k00":0,"k01":1,"k02":2,"k03":3,"k04":4,"k05":5,"k06":6,"k07":7,"k08":8,"k09":9,"k10":10,"k11":11,"k12":12,"k13":13,"k14":14,"k15":15}`},
		{"a group after With keeps the logger's attributes outside it", func(l *slog.Logger) {
			l.With("a", 1).WithGroup("g").With("a", 2).Info("m", "b", 3)
		}, `{"level":"INFO","msg":"m","a":1,"g":{"a":2,"b":3}}`},
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

// nopHandler takes every record and writes nothing.
type nopHandler struct{}

func (nopHandler) Enabled(context.Context, slog.Level) bool  { return true }
func (nopHandler) Handle(context.Context, slog.Record) error { return nil }
func (h nopHandler) WithAttrs([]slog.Attr) slog.Handler      { return h }
func (h nopHandler) WithGroup(string) slog.Handler           { return h }

// A record with keys of its own costs the handler no allocation: it is
// handed on as it is (each certificate issued is logged).
func TestUniqueKeysDistinctRecordDoesNotAllocate(t *testing.T) {
	h := UniqueKeys(nopHandler{}).WithAttrs([]slog.Attr{slog.String(Component, "certservice")})
	r := slog.NewRecord(time.Now(), slog.LevelInfo, "certificate issued", 0)
	r.AddAttrs(slog.String(SPIFFEID, "spiffe://example.org/w"), slog.String("method", "x509-svid"),
		slog.String("serial", "1f"), slog.String(Address, "127.0.0.1:1"))
	ctx := context.Background()
	_ = h.Handle(ctx, r) // makes the pre-formatted handler once
	assert.Zero(t, testing.AllocsPerRun(100, func() { _ = h.Handle(ctx, r) }))
}
