package federation

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The dialer's verdict: AllowPrivate opens loopback but never a metadata
// address, in any spelling.
func TestControlDial(t *testing.T) {
	t.Parallel()
	strict := &Fetcher{cfg: FetcherConfig{}}
	lab := &Fetcher{cfg: FetcherConfig{AllowPrivate: true}}
	tests := []struct {
		address      string
		strict, lab  bool // allowed
		strictReason string
	}{
		{"8.8.8.8:443", true, true, ""},
		{"[2001:4860:4860::8888]:443", true, true, ""},
		{"127.0.0.1:443", false, true, "is a loopback address; set --federation-allow-private to allow it"},
		{"[::1]:443", false, true, "set --federation-allow-private"},
		{"169.254.1.1:443", false, true, "set --federation-allow-private"},
		{"169.254.169.254:80", false, false, "refused even with --federation-allow-private"},
		{"[64:ff9b::a9fe:a9fe]:443", false, false, "refused even with --federation-allow-private"},
		{"[fd20:ce::254]:443", false, false, "refused even with --federation-allow-private"},
		{"168.63.129.16:443", false, false, "refused even with --federation-allow-private"},
		{"not-an-address", false, false, "cannot parse"},
	}
	for _, tt := range tests {
		t.Run(tt.address, func(t *testing.T) {
			err := strict.controlDial("tcp", tt.address, nil)
			if tt.strict {
				assert.NoError(t, err)
			} else {
				require.ErrorIs(t, err, ErrRefusedAddress)
				assert.Contains(t, err.Error(), tt.strictReason)
			}
			err = lab.controlDial("tcp", tt.address, nil)
			if tt.lab {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, ErrRefusedAddress)
			}
		})
	}
}

// A lab that sets AllowPrivate still cannot be pointed at a metadata
// service, by URL or by any IPv6 spelling of it; the dialer refuses before
// connect(2), so no packet leaves.
func TestFetchRefusesMetadataEvenWithAllowPrivate(t *testing.T) {
	t.Parallel()
	fx := newFetchFixture(t)
	for _, host := range []string{"169.254.169.254", "[64:ff9b::a9fe:a9fe]", "[::a9fe:a9fe]", "[2002:a9fe:a9fe::1]", "[fd00:ec2::254]", "168.63.129.16"} {
		t.Run(host, func(t *testing.T) {
			_, err := fx.fetcher(FetcherConfig{AllowPrivate: true}).Fetch(t.Context(), web(t, fetchTD, "https://"+host+"/latest/meta-data/"), "")
			require.ErrorIs(t, err, ErrRefusedAddress)
			assert.Equal(t, "refused_address", FetchErrorKind(err))
			assert.Contains(t, err.Error(), "refused even with --federation-allow-private")
		})
	}
}
