package cli

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --admin as operators type it: what cannot work says what to write
// instead of Go's URL error (issue 36, item 4).
func TestAdminURL(t *testing.T) {
	for _, ok := range []string{"http://127.0.0.1:15014", "https://admin.example", "unix:///run/admin.sock", "http://[::1]:15014"} {
		got, err := AdminURL(ok)
		require.NoError(t, err, ok)
		assert.Equal(t, ok, got)
	}
	_, err := AdminURL("127.0.0.1:15014")
	assert.EqualError(t, err, `--admin "127.0.0.1:15014": want http://HOST:PORT (e.g. http://127.0.0.1:15014), https://HOST:PORT or unix://PATH of the server's --admin-socket`)
	for _, bad := range []string{"", "ftp://x:1", "http://", "http://u:p@127.0.0.1:1", "http://127.0.0.1:1?x=1", ":::"} {
		_, err := AdminURL(bad)
		assert.ErrorContains(t, err, "want http://HOST:PORT (e.g. http://", bad)
	}
	assert.ErrorContains(t, TokenTransportOK("127.0.0.1:15014"), "want http://HOST:PORT")
}
