package broker

import (
	"sync"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/proto"

	wapi "github.com/trustbridge/trustbridge/sds/workload"
)

// messages shares the message built from one State among the streams
// that send it: pods of one service account are one identity, one
// Source, so a rotation would otherwise marshal the same private key and
// concatenate the same certificates once per pod (2x the Workload API's
// time for a hundred pods per identity, BenchmarkRotationFanOutInterleaved).
// An entry lives while a stream holds it: a stream holds the one of the
// State it last built from, so streams that reach a State late still
// find it, and the entry goes once every stream moved on.
type messages struct {
	mu sync.Mutex
	m  map[messageKey]*message
}

// messageKey names what a builder makes from a State: the method's
// builder (one per method) for the workload's identity, which the
// builders read of the Workload besides the State.
type messageKey struct {
	state       *wapi.State
	api, method string
	id          spiffeid.ID
}

type message struct {
	key  messageKey
	refs int // guarded by messages.mu
	once sync.Once
	msg  proto.Message
	err  error
}

// acquire returns the entry for k, which the caller releases once it no
// longer sends from k's State.
func (ms *messages) acquire(k messageKey) *message {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.m == nil {
		ms.m = map[messageKey]*message{}
	}
	e := ms.m[k]
	if e == nil {
		e = &message{key: k}
		ms.m[k] = e
	}
	e.refs++
	return e
}

// release lets go of e (nil: nothing).
func (ms *messages) release(e *message) {
	if e == nil {
		return
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if e.refs--; e.refs == 0 {
		delete(ms.m, e.key)
	}
}

// get is the message built from st for w, built by the first stream to
// ask. A refusal is not shared: it names the workload it refuses.
func (e *message) get(build builder, w *Workload, st *wapi.State) (proto.Message, error) {
	e.once.Do(func() { e.msg, e.err = build(w, st) })
	if e.err != nil {
		return build(w, st)
	}
	return e.msg, nil
}
