package federation

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// CheckDocument is the poller's verdict: for every document, a poller that
// fetches it (holding what CheckDocument is given as held) refuses it
// exactly when CheckDocument does, for the same reason (issue 21 item 6).
func TestCheckDocumentAgreesWithThePoller(t *testing.T) {
	pf := newPollFixture(t)
	tolerant, err := os.ReadFile("../testdata/bundles/tolerant.json")
	require.NoError(t, err)
	other := testca.New(t, "other.org")
	sameTD := testca.New(t, fetchTD)
	held := docWith(t, pf.fx.bundle, 7)
	tests := []struct {
		name       string
		held       []byte // fetched first, so the poller holds it
		doc        []byte
		allowEmpty bool
		want       error // nil: accepted
	}{
		{name: "tolerant.json for its own trust domain", doc: tolerant},
		{name: "a root naming another trust domain", doc: docWith(t, other.Bundle(), 1), want: ErrTrustDomainMismatch},
		{name: "keys: []", doc: []byte(`{"keys":[]}`), want: ErrEmptyBundle},
		{name: "keys: [] allowed", doc: []byte(`{"keys":[]}`), allowEmpty: true},
		{name: "not JSON", doc: []byte(`{nope`), want: ErrBundle},
		{name: "duplicate member", doc: []byte(`{"keys":[],"keys":[]}`), want: ErrBundle},
		{name: "sequence going back", held: held, doc: docWith(t, pf.fx.bundle, 6), want: ErrSequenceRegression},
		{name: "other keys under the same sequence", held: held, doc: docWith(t, sameTD.Bundle(), 7), want: ErrSequenceConflict},
		{name: "next sequence", held: held, doc: docWith(t, sameTD.Bundle(), 8)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewPoller(PollerConfig{
				Endpoints:  []Endpoint{pf.ep},
				Fetcher:    FetcherConfig{AllowPrivate: true, WebRoots: pf.pool, Timeout: 5 * time.Second},
				Sink:       &memSink{},
				AllowEmpty: tt.allowEmpty,
				Registerer: prometheus.NewRegistry(),
			})
			require.NoError(t, err)
			var heldBundle *spiffebundle.Bundle
			if tt.held != nil {
				pf.srv.set(serveDoc(tt.held))
				require.NoError(t, p.Refresh(t.Context(), pf.ep.TrustDomain))
				heldBundle = p.Bundles()[0]
			}
			pf.srv.set(serveDoc(tt.doc))
			pollErr := p.Refresh(t.Context(), pf.ep.TrustDomain)
			_, _, _, checkErr := CheckDocument(pf.ep.TrustDomain, tt.doc, heldBundle, tt.allowEmpty)
			if tt.want == nil {
				assert.NoError(t, pollErr)
				assert.NoError(t, checkErr)
				return
			}
			require.ErrorIs(t, pollErr, tt.want)
			require.ErrorIs(t, checkErr, tt.want)
			// The same reason, word for word, after the poller's own
			// "fetch ... from URL" context.
			reason := strings.TrimPrefix(checkErr.Error(), "federation: ")
			assert.True(t, strings.HasSuffix(pollErr.Error(), reason), "poller: %s\ncheck:  %s", pollErr, checkErr)
		})
	}
}

func TestRefusedWarning(t *testing.T) {
	pf := newPollFixture(t)
	other := testca.New(t, "other.org")
	_, _, warnings, err := CheckDocument(pf.ep.TrustDomain, docWith(t, other.Bundle(), 1), nil, false)
	require.Error(t, err)
	assert.ErrorIs(t, RefusedWarning(warnings), ErrTrustDomainMismatch)
	assert.NoError(t, RefusedWarning(nil))
	assert.True(t, errors.Is(err, ErrTrustDomainMismatch))
}
