package servertest

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/server/api"
)

// Federated is the list of trust domains the server at admin reports on
// GET /v1/federation as polled.
func Federated(t testing.TB, admin string) []string {
	t.Helper()
	return FederatedSequences(t, admin, nil)
}

// FederatedSequences returns the trust domains /v1/federation reports as
// polled (not the bundles held as set, state static), and, into seqs when
// not nil, their sequence numbers (0 for none).
func FederatedSequences(t testing.TB, admin string, seqs *[]uint64) []string {
	t.Helper()
	code, body := Get(t, "http://"+admin+"/v1/federation")
	require.Equal(t, http.StatusOK, code, body)
	var status []api.FederationStatus
	require.NoError(t, json.Unmarshal([]byte(body), &status))
	var tds []string
	for _, s := range status {
		if s.State == api.StateStatic {
			continue
		}
		tds = append(tds, s.TrustDomain)
		if seqs != nil {
			var n uint64
			if s.Sequence != nil {
				n = *s.Sequence
			}
			*seqs = append(*seqs, n)
		}
	}
	return tds
}

// TrustDoc is the answer of GET /v1/trust.
type TrustDoc = api.Trust

// Get fetches url and returns its status code and body.
func Get(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// GetSnapshot is the server's GET /v1/snapshot; admin is http://host:port.
func GetSnapshot(t testing.TB, admin string) api.Snapshot {
	t.Helper()
	code, body := Get(t, admin+"/v1/snapshot")
	require.Equal(t, http.StatusOK, code, body)
	var snap api.Snapshot
	require.NoError(t, json.Unmarshal([]byte(body), &snap))
	return snap
}

// MetricVia sums the samples of name whose labels contain every one of
// labels (`result="verified"`), read through c from the /metrics of the
// admin listener at admin (host:port).
func MetricVia(tb testing.TB, c *http.Client, admin, name string, labels ...string) float64 {
	tb.Helper()
	resp, err := c.Get("http://" + admin + "/metrics")
	require.NoError(tb, err)
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
lines:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(line, l) {
				continue lines
			}
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		require.NoError(tb, err)
		sum += v
	}
	require.NoError(tb, sc.Err())
	return sum
}

// TrustOf is the server's GET /v1/trust; admin is host:port.
func TrustOf(t testing.TB, admin string) TrustDoc {
	t.Helper()
	code, body := Get(t, "http://"+admin+"/v1/trust")
	require.Equal(t, 200, code, body)
	var doc TrustDoc
	require.NoError(t, json.Unmarshal([]byte(body), &doc))
	return doc
}
