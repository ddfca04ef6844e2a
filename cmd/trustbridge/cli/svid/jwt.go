package svid

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

// JWTAdmin is the admin path of jwt mint: --spiffe-id, and the admin
// API's address and token.
type JWTAdmin struct {
	Admin    cli.AdminClient
	SPIFFEID string
	cmd      *cobra.Command
}

// adminFlags are JWTAdmin's flags but --spiffe-id: meaningful with it
// only.
var adminFlags = []string{"admin", "data-dir", "admin-token-file"}

// AddFlags registers JWTAdmin's flags on cmd.
func (j *JWTAdmin) AddFlags(cmd *cobra.Command) {
	j.cmd = cmd
	f := cmd.Flags()
	f.StringVar(&j.SPIFFEID, "spiffe-id", "", "mint for this identity of the server's trust domain, as an operator, on the admin API (--admin) instead of for your own over the certificate service")
	f.String("admin", "http://127.0.0.1:15014", "with --spiffe-id: "+cli.AdminFlagHelp)
	j.Admin.AddAuthFlags(f)
	for _, name := range adminFlags[1:] {
		f.Lookup(name).Usage = "with --spiffe-id: " + f.Lookup(name).Usage
	}
}

// Enabled says whether --spiffe-id chose the admin path; an admin flag
// given without it is refused.
func (j *JWTAdmin) Enabled() (bool, error) {
	if j.SPIFFEID != "" {
		return true, nil
	}
	for _, name := range adminFlags {
		if j.cmd.Flags().Changed(name) {
			return false, fmt.Errorf("--%s is for minting on the admin API, which --spiffe-id ID selects; without it the token is for your own identity, over the certificate service (--ca-addr)", name)
		}
	}
	return false, nil
}

// Mint asks the admin API for a JWT-SVID of --spiffe-id; conflicting
// names the certificate service's flags that were given too.
func (j *JWTAdmin) Mint(ctx context.Context, audience []string, ttl, timeout time.Duration, conflicting []string) (api.JWTSVIDMinted, error) {
	var res api.JWTSVIDMinted
	if len(conflicting) > 0 {
		return res, fmt.Errorf("--spiffe-id mints as an operator on the admin API (--admin); %s %s for minting your own identity over the certificate service: give one or the other",
			strings.Join(conflicting, ", "), map[bool]string{true: "is", false: "are"}[len(conflicting) == 1])
	}
	id, err := spiffeid.FromString(j.SPIFFEID)
	if err != nil {
		return res, fmt.Errorf("--spiffe-id %q: %w", j.SPIFFEID, err)
	}
	if err := checkTTL(ttl); err != nil {
		return res, err
	}
	if timeout <= 0 {
		return res, errors.New("--timeout must be positive")
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err = post(ctx, cli.AdminFrom(j.cmd, &j.Admin), "/v1/svid/jwt", "jwt mint --spiffe-id",
		api.JWTSVIDMint{SPIFFEID: id.String(), Audience: audience, TTLSeconds: int64(ttl / time.Second)}, &res)
	return res, err
}
