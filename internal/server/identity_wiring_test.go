package server

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// storeBundles hands out every trust domain of the store's snapshot, the
// same slice while the snapshot stands, and a channel that closes when
// the store changes.
func TestStoreBundles(t *testing.T) {
	store := trust.NewStore()
	local, peer := testca.New(t, "example.org").Bundle(), testca.New(t, "partner.example").Bundle()
	store.Set("local", local)
	src := &storeBundles{store: store}

	got, changed := src.Bundles()
	require.Len(t, got, 1)
	assert.Equal(t, "example.org", got[0].TrustDomain().Name())
	again, _ := src.Bundles()
	assert.Same(t, &got[0], &again[0], "one listing per snapshot")

	store.Set("federation", peer)
	select {
	case <-changed:
	default:
		t.Fatal("a change of the store closes the channel")
	}
	got, _ = src.Bundles()
	require.Len(t, got, 2)
	assert.Equal(t, []string{"example.org", "partner.example"}, []string{got[0].TrustDomain().Name(), got[1].TrustDomain().Name()})
}
