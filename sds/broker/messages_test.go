package broker

import (
	"errors"
	"testing"

	brokerpb "github.com/spiffe/go-spiffe/v2/exp/proto/spiffe/broker"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	wapi "github.com/trustbridge/trustbridge/sds/workload"
)

// Streams on one State share one message while any holds it; a refusal
// is built for each, since it names its workload.
func TestMessagesShared(t *testing.T) {
	w := newWorld(t)
	cell := cellOf(t, w.state(t, web))
	st, _ := cell.State()
	builds := 0
	build := func(wl *Workload, st *wapi.State) (proto.Message, error) {
		builds++
		return x509SVIDMessage(wl, st)
	}
	var ms messages
	k := messageKey{state: st, api: apiBroker, method: "SubscribeToX509SVID", id: web}
	a, b := ms.acquire(k), ms.acquire(k)
	ma, err := a.get(build, &Workload{ID: web, Name: "pid 1"}, st)
	require.NoError(t, err)
	mb, err := b.get(build, &Workload{ID: web, Name: "pid 2"}, st)
	require.NoError(t, err)
	assert.Same(t, ma, mb)
	assert.Equal(t, web.String(), ma.(*brokerpb.SubscribeToX509SVIDResponse).GetSvids()[0].GetSpiffeId())
	assert.Equal(t, 1, builds)
	ms.release(a)
	c := ms.acquire(k)
	mc, err := c.get(build, &Workload{ID: web, Name: "pid 3"}, st)
	require.NoError(t, err)
	assert.Same(t, ma, mc, "held by b, the entry stays")
	ms.release(b)
	ms.release(c)
	assert.Empty(t, ms.m, "no stream holds the State: the entry goes")

	refuse := func(wl *Workload, _ *wapi.State) (proto.Message, error) {
		return nil, errors.New("refused " + wl.Name)
	}
	k.method = "other"
	a, b = ms.acquire(k), ms.acquire(k)
	_, err = a.get(refuse, &Workload{Name: "pid 1"}, st)
	assert.EqualError(t, err, "refused pid 1")
	_, err = b.get(refuse, &Workload{Name: "pid 2"}, st)
	assert.EqualError(t, err, "refused pid 2")
	ms.release(a)
	ms.release(b)
	assert.Empty(t, ms.m)
}
