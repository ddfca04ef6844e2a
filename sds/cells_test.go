package sds

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestTrustCell(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	local, remote := newTestCA(t, localTD, clk), newTestCA(t, remoteTD, clk)
	c := NewTrustCell()
	t0 := c.Trust()
	require.NotNil(t, t0)
	assert.Empty(t, t0.Bundles)
	assert.False(t, closed(t0.Changed))

	in := []*x509bundle.Bundle{remote.bundle(), local.bundle()}
	require.NoError(t, c.Set(in))
	assert.True(t, closed(t0.Changed), "Set closes the previous Changed")
	t1 := c.Trust()
	require.Len(t, t1.Bundles, 2)
	assert.Equal(t, localTD, t1.Bundles[0].TrustDomain(), "sorted by trust domain name")
	assert.Equal(t, remoteTD, t1.Bundles[1].TrustDomain())
	assert.Equal(t, remoteTD, in[0].TrustDomain(), "the caller's slice is not reordered")
	in[1].AddX509Authority(remote.cert)
	assert.Len(t, t1.Bundles[0].X509Authorities(), 1, "bundles are copied")

	tests := []struct {
		name    string
		bundles []*x509bundle.Bundle
		wantErr string
	}{
		{"nil bundle", []*x509bundle.Bundle{local.bundle(), nil}, "bundle 1 is nil"},
		{"duplicate trust domain", []*x509bundle.Bundle{local.bundle(), remote.bundle(), local.bundle()}, `two bundles for trust domain "local.test"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.ErrorContains(t, c.Set(tt.bundles), tt.wantErr)
			assert.Same(t, t1, c.Trust(), "the previous trust stays")
			assert.False(t, closed(t1.Changed))
		})
	}

	require.NoError(t, c.Set(nil))
	assert.True(t, closed(t1.Changed))
	assert.Empty(t, c.Trust().Bundles)
}

func TestCredentialCell(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ca := newTestCA(t, localTD, clk)
	issue := func(t *testing.T, id spiffeid.ID) ([]*x509.Certificate, *ecdsa.PrivateKey) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		chain, err := ca.Sign(key.Public(), id, time.Hour)
		require.NoError(t, err)
		return chain, key
	}
	c := NewCredentialCell(idA)
	_, err := c.Credential(context.Background(), idA)
	require.ErrorIs(t, err, ErrNoCredential)

	chainA, keyA := issue(t, idA)
	require.NoError(t, c.Set(chainA, keyA))
	first, err := c.Credential(context.Background(), idA)
	require.NoError(t, err)
	assert.Equal(t, chainA, first.Chain)
	assert.Same(t, keyA, first.Key)

	_, err = c.Credential(context.Background(), idB)
	assert.ErrorContains(t, err, "not spiffe://local.test/ns/b/sa/b")

	chainB, keyB := issue(t, idB)
	_, otherKey := issue(t, idA)
	tests := []struct {
		name    string
		chain   []*x509.Certificate
		key     *ecdsa.PrivateKey
		wantErr string
	}{
		{"other identity", chainB, keyB, "leaf is for spiffe://local.test/ns/b/sa/b"},
		{"key mismatch", chainA, otherKey, "private key does not match"},
		{"empty chain", nil, keyA, "empty certificate chain"},
		{"CA certificate", []*x509.Certificate{ca.cert}, keyA, "leaf is for spiffe://local.test, not"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.ErrorContains(t, c.Set(tt.chain, tt.key), tt.wantErr)
			got, err := c.Credential(context.Background(), idA)
			require.NoError(t, err)
			assert.Same(t, first, got, "the previous credential stays")
			assert.False(t, closed(first.Changed))
		})
	}

	chain2, key2 := issue(t, idA)
	require.NoError(t, c.Set(chain2, key2))
	assert.True(t, closed(first.Changed))
	got, err := c.Credential(context.Background(), idA)
	require.NoError(t, err)
	assert.Same(t, key2, got.Key)
}
