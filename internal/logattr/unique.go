package logattr

import (
	"context"
	"log/slog"
	"slices"
	"sync"
)

// UniqueKeys wraps h so that no record it writes repeats a key: an
// attribute added by Logger.With, or in the call, replaces an earlier one
// of the same key instead of following it. slog's own handlers write both
// ({"component":"agent",...,"component":"rotator"}), which is valid JSON
// that most log pipelines read as the last value and some reject; a logger
// passed down through several layers, each naming its component, produced
// exactly that. The most specific value (the last one added) wins.
//
// A record whose keys are its own and none of the logger's (every record
// on the hot paths: each certificate issued is logged) goes to h with the
// logger's attributes pre-formatted once, as h would write them after
// Logger.With; only a record that repeats a key is merged here, at the
// cost of a copy of its attributes.
func UniqueKeys(h slog.Handler) slog.Handler {
	return newUnique(h, nil)
}

type uniqueHandler struct {
	inner slog.Handler
	attrs []slog.Attr // keys unique
	// pre is inner with attrs, made on the first record that needs it: a
	// logger made per call with With and never used costs no formatting.
	pre func() slog.Handler
}

func newUnique(inner slog.Handler, attrs []slog.Attr) *uniqueHandler {
	h := &uniqueHandler{inner: inner, attrs: attrs}
	h.pre = sync.OnceValue(func() slog.Handler {
		if len(attrs) == 0 {
			return inner
		}
		return inner.WithAttrs(attrs)
	})
	return h
}

func (h *uniqueHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *uniqueHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return newUnique(h.inner, mergeAttrs(h.attrs, as))
}

// WithGroup hands the attributes so far to the inner handler: keys in
// different groups do not collide.
func (h *uniqueHandler) WithGroup(name string) slog.Handler {
	return newUnique(h.pre().WithGroup(name), nil)
}

func (h *uniqueHandler) Handle(ctx context.Context, r slog.Record) error {
	if h.distinct(r) {
		return h.pre().Handle(ctx, r)
	}
	as := make([]slog.Attr, 0, r.NumAttrs())
	r.Attrs(func(a slog.Attr) bool {
		as = append(as, a)
		return true
	})
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	out.AddAttrs(mergeAttrs(h.attrs, as)...)
	return h.inner.Handle(ctx, out)
}

// maxFastKeys is the most attributes a record may have for distinct to
// check it without allocating.
const maxFastKeys = 16

// distinct reports whether r can be written as it is after the logger's
// attributes: its keys are its own, none of the logger's, and none of its
// attributes is an inline group (whose keys would need flattening to
// compare). It never allocates; false sends the record to the merge.
func (h *uniqueHandler) distinct(r slog.Record) bool {
	if r.NumAttrs() > maxFastKeys {
		return false
	}
	var seen [maxFastKeys]string
	n, ok := 0, true
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "" {
			ok = false // an inline group, or an empty attribute
			return false
		}
		for _, k := range seen[:n] {
			if k == a.Key {
				ok = false
				return false
			}
		}
		for _, b := range h.attrs {
			if b.Key == a.Key {
				ok = false
				return false
			}
		}
		seen[n] = a.Key
		n++
		return true
	})
	return ok
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
