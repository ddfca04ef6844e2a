package workload

import (
	"bytes"
	"crypto/x509"
	"fmt"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	protobuf "google.golang.org/protobuf/proto"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
)

// frame is a response message already marshalled, sent as is by codec:
// one frame per State is shared by every stream that sends it, so a
// rotation costs one marshal whatever the number of watchers.
//
// grpc.PreparedMsg would also marshal once, but it compresses with the
// compressor of the stream it was prepared on, and a stream's compressor
// follows its client's request: a frame prepared on a compressing
// client's stream would reach the others compressed. Here each stream
// compresses (or not) the shared bytes itself.
type frame struct {
	b []byte
}

// codec is the proto codec, except that a *frame is sent as its bytes.
type codec struct {
	encoding.CodecV2
}

func newCodec() codec { return codec{encoding.GetCodecV2(proto.Name)} }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*frame); ok {
		// SliceBuffer's Free does nothing: the shared bytes are never
		// returned to a pool.
		return mem.BufferSlice{mem.SliceBuffer(f.b)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// encoded is a State's responses, each a frame or the status a stream
// gets instead.
type encoded struct {
	state          *State
	x509SVID       *frame
	x509Bundles    *frame
	jwtBundles     *frame
	refusal        error // PermissionDenied without identity, else nil
	encodingFailed error // Internal: the State could not be encoded
}

// errNoIdentity is the spec's answer to a workload not entitled to any
// SVID (Workload API §5.2, §6.2).
var errNoIdentity = status.Error(codes.PermissionDenied, "no identity issued")

// encodeState marshals the responses of st. A frame equal to prev's is
// prev's, so streams see by pointer that nothing they carry changed.
func encodeState(st *State, prev *encoded) *encoded {
	e := &encoded{state: st}
	if st.SVID == nil {
		e.refusal = errNoIdentity
		return e
	}
	svid, err := x509SVIDResponse(st)
	if err != nil {
		e.encodingFailed = status.Errorf(codes.Internal, "encoding the X509-SVID: %v", err)
		return e
	}
	jwt, err := jwtBundlesResponse(st.Bundles)
	if err != nil {
		e.encodingFailed = status.Errorf(codes.Internal, "encoding the JWT bundles: %v", err)
		return e
	}
	msgs := []protobuf.Message{svid, x509BundlesResponse(st.Bundles), jwt}
	var prevFrames [3]*frame
	if prev != nil {
		prevFrames = [3]*frame{prev.x509SVID, prev.x509Bundles, prev.jwtBundles}
	}
	var out [3]*frame
	for i, m := range msgs {
		b, err := protobuf.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			e.encodingFailed = status.Errorf(codes.Internal, "encoding a response: %v", err)
			return e
		}
		if p := prevFrames[i]; p != nil && bytes.Equal(p.b, b) {
			out[i] = p
		} else {
			out[i] = &frame{b: b}
		}
	}
	e.x509SVID, e.x509Bundles, e.jwtBundles = out[0], out[1], out[2]
	return e
}

// x509SVIDResponse is the SVID with its trust domain's X.509 bundle, and
// every other trust domain's as federated_bundles; all ASN.1 DER, the
// certificates of a chain or bundle concatenated (Workload API §5.1).
func x509SVIDResponse(st *State) (*workloadpb.X509SVIDResponse, error) {
	key, err := x509.MarshalPKCS8PrivateKey(st.SVID.Key)
	if err != nil {
		return nil, fmt.Errorf("private key: %w", err)
	}
	own := st.SVID.ID.TrustDomain()
	resp := &workloadpb.X509SVIDResponse{FederatedBundles: map[string][]byte{}}
	var ownBundle []byte
	for _, b := range st.Bundles {
		if b.TrustDomain() == own {
			ownBundle = concatDER(b.X509Authorities())
		} else if len(b.X509Authorities()) > 0 {
			resp.FederatedBundles[b.TrustDomain().IDString()] = concatDER(b.X509Authorities())
		}
	}
	resp.Svids = []*workloadpb.X509SVID{{
		SpiffeId:    st.SVID.ID.String(),
		X509Svid:    concatDER(st.SVID.Chain),
		X509SvidKey: key,
		Bundle:      ownBundle,
	}}
	return resp, nil
}

// x509BundlesResponse holds every trust domain with X.509 authorities,
// the SVID's own included.
func x509BundlesResponse(bundles []*spiffebundle.Bundle) *workloadpb.X509BundlesResponse {
	resp := &workloadpb.X509BundlesResponse{Bundles: make(map[string][]byte, len(bundles))}
	for _, b := range bundles {
		if len(b.X509Authorities()) > 0 {
			resp.Bundles[b.TrustDomain().IDString()] = concatDER(b.X509Authorities())
		}
	}
	return resp
}

// jwtBundlesResponse holds every trust domain with JWT authorities as a
// JWKS document (Workload API §6.2, FetchJWTBundles), keys sorted by key
// ID: go-spiffe's jwtbundle.Bundle.Marshal follows map order, so with two
// authorities (during every JWT key rotation) equal States would encode
// to different bytes and every watcher be pushed on every State.
func jwtBundlesResponse(bundles []*spiffebundle.Bundle) (*workloadpb.JWTBundlesResponse, error) {
	resp := &workloadpb.JWTBundlesResponse{Bundles: make(map[string][]byte, len(bundles))}
	for _, b := range bundles {
		if len(b.JWTAuthorities()) == 0 {
			continue
		}
		doc, err := bundledoc.MarshalJWKS(b.JWTAuthorities())
		if err != nil {
			return nil, fmt.Errorf("trust domain %q: %w", b.TrustDomain().Name(), err)
		}
		resp.Bundles[b.TrustDomain().IDString()] = doc
	}
	return resp, nil
}

func concatDER(certs []*x509.Certificate) []byte {
	n := 0
	for _, c := range certs {
		n += len(c.Raw)
	}
	out := make([]byte, 0, n)
	for _, c := range certs {
		out = append(out, c.Raw...)
	}
	return out
}
