package certservice

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/trustbridge/trustbridge/internal/identityapi"
)

// FuzzMintRequest drives the validation of MintJWTSVID requests with
// arbitrary wire bytes: whatever parses, checkMintRequest either refuses
// it with InvalidArgument or returns 1 to MaxAudiences non-empty, bounded,
// UTF-8 audiences and a lifetime that is not negative.
func FuzzMintRequest(f *testing.F) {
	for _, req := range []*identityapi.MintJWTSVIDRequest{
		{},
		{Audience: []string{"a"}},
		{Audience: []string{"https://api.example.com", "b"}, TtlSeconds: 300},
		{Audience: []string{""}},
		{Audience: []string{"a"}, TtlSeconds: -1},
		{Audience: []string{"a"}, TtlSeconds: 1 << 62},
		{Audience: []string{strings.Repeat("x", MaxAudienceBytes+1)}},
		{Audience: make([]string, MaxAudiences+1)},
	} {
		b, err := proto.Marshal(req)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x02, 0xff, 0xfe}) // an audience that is not UTF-8
	f.Fuzz(func(t *testing.T, wire []byte) {
		var req identityapi.MintJWTSVIDRequest
		if proto.Unmarshal(wire, &req) != nil {
			return
		}
		aud, ttl, ref := checkMintRequest(&req)
		if ref != nil {
			assert.Equal(t, codes.InvalidArgument, ref.code)
			assert.NotEmpty(t, ref.msg)
			return
		}
		require.NotEmpty(t, aud)
		assert.LessOrEqual(t, len(aud), MaxAudiences)
		for _, a := range aud {
			assert.NotEmpty(t, a)
			assert.LessOrEqual(t, len(a), MaxAudienceBytes)
			assert.True(t, utf8.ValidString(a))
			assert.False(t, strings.ContainsFunc(a, unicode.IsControl))
		}
		assert.GreaterOrEqual(t, int64(ttl), int64(0))
	})
}
