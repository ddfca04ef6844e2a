package logattr

import (
	"context"
	"log/slog"
	"slices"
)

// UniqueKeys wraps h so that no record it writes repeats a key: an
// attribute added by Logger.With, or in the call, replaces an earlier one
// of the same key instead of following it. slog's own handlers write both
// ({"component":"agent",...,"component":"rotator"}), which is valid JSON
// that most log pipelines read as the last value and some reject; a logger
// passed down through several layers, each naming its component, produced
// exactly that. The most specific value (the last one added) wins.
//
// Attributes are kept here rather than pre-formatted by h, which costs an
// allocation per record; the server logs little on its hot paths.
func UniqueKeys(h slog.Handler) slog.Handler {
	return &uniqueHandler{inner: h}
}

type uniqueHandler struct {
	inner slog.Handler
	attrs []slog.Attr // keys unique
}

func (h *uniqueHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *uniqueHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &uniqueHandler{inner: h.inner, attrs: mergeAttrs(h.attrs, as)}
}

// WithGroup hands the attributes so far to the inner handler: keys in
// different groups do not collide.
func (h *uniqueHandler) WithGroup(name string) slog.Handler {
	return &uniqueHandler{inner: h.inner.WithAttrs(h.attrs).WithGroup(name)}
}

func (h *uniqueHandler) Handle(ctx context.Context, r slog.Record) error {
	as := make([]slog.Attr, 0, r.NumAttrs())
	r.Attrs(func(a slog.Attr) bool {
		as = append(as, a)
		return true
	})
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	out.AddAttrs(mergeAttrs(h.attrs, as)...)
	return h.inner.Handle(ctx, out)
}

// mergeAttrs is base followed by add, an attribute of add replacing the
// earlier one of the same key in place. base is not modified. add's
// inline groups (a group with an empty key) are flattened first, as a
// handler writes them, so their keys take part too.
func mergeAttrs(base, add []slog.Attr) []slog.Attr {
	out := slices.Clone(base)
	for _, a := range inline(nil, add) {
		if i := slices.IndexFunc(out, func(b slog.Attr) bool { return b.Key == a.Key }); i >= 0 {
			out[i] = a
		} else {
			out = append(out, a)
		}
	}
	return out
}

// inline appends as to out with inline groups flattened and empty
// attributes dropped, the handler rules of log/slog.
func inline(out, as []slog.Attr) []slog.Attr {
	for _, a := range as {
		a.Value = a.Value.Resolve()
		switch {
		case a.Key == "" && a.Value.Kind() == slog.KindGroup:
			out = inline(out, a.Value.Group())
		case a.Equal(slog.Attr{}):
		case a.Value.Kind() == slog.KindGroup && len(a.Value.Group()) == 0:
			// An empty group is not written; it replaces nothing.
		default:
			out = append(out, a)
		}
	}
	return out
}
