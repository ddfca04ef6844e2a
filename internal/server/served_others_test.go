package server

import (
	"testing"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// The bundle endpoint serves, for other trust domains, what the trust
// store holds as each source set it: a polled endpoint's bundle and one
// set at run time (bundle set), which it left out before (issue 36). Our
// CA's is the local bundle and bundle files are served from the files, so
// neither comes twice.
func TestServedOthers(t *testing.T) {
	store := trust.NewStore()
	store.Set(caSource, testca.New(t, "example.org").Bundle())
	polled := testca.New(t, "polled.example").Bundle()
	polled.SetSequenceNumber(4)
	store.Set(federation.SourceName(polled.TrustDomain()), polled)
	set := testca.New(t, "set.example").Bundle()
	set.SetSequenceNumber(9)
	store.Set(staticSource, set)
	store.Set("file:/etc/relayed.json", testca.New(t, "relayed.example").Bundle())

	got := servedOthers(store.Published())
	require.Len(t, got, 2)
	assert.True(t, polled.Equal(got[0]), "the polled bundle, sequence included")
	assert.True(t, set.Equal(got[1]), "the bundle set at run time, as set")

	store.Remove(staticSource, set.TrustDomain())
	assert.Equal(t, []*spiffebundle.Bundle{got[0]}, servedOthers(store.Published()), "a removed bundle is no longer served")
}
