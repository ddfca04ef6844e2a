package broker

import (
	"context"
	"crypto/x509"
	"fmt"

	brokerpb "github.com/spiffe/go-spiffe/v2/exp/proto/spiffe/broker"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	wapi "github.com/trustbridge/trustbridge/sds/workload"
)

// brokerAPI is the SPIFFE Broker API (spiffe.broker.API).
type brokerAPI struct {
	brokerpb.UnimplementedAPIServer
	s *Server
}

// subscribe serves one of the Broker API's streams for req's reference.
func (a *brokerAPI) subscribe(ctx context.Context, method string, ref *brokerpb.WorkloadReference, build builder, send func(proto.Message) error) error {
	c, err := a.s.begin(ctx, apiBroker, method)
	if err != nil {
		a.s.end(ctx, c, nil, err)
		return err
	}
	r, err := ParseReference(ref)
	if err != nil {
		err = a.s.status(ctx, c, err)
		a.s.end(ctx, c, nil, err)
		return err
	}
	c.ref = r.String()
	return a.s.stream(ctx, c, &r, build, send)
}

func (a *brokerAPI) SubscribeToX509SVID(req *brokerpb.SubscribeToX509SVIDRequest, ss grpc.ServerStreamingServer[brokerpb.SubscribeToX509SVIDResponse]) error {
	return a.subscribe(ss.Context(), "SubscribeToX509SVID", req.GetReference(), x509SVIDMessage,
		func(m proto.Message) error { return ss.Send(m.(*brokerpb.SubscribeToX509SVIDResponse)) })
}

func (a *brokerAPI) SubscribeToX509Bundles(req *brokerpb.SubscribeToX509BundlesRequest, ss grpc.ServerStreamingServer[brokerpb.SubscribeToX509BundlesResponse]) error {
	return a.subscribe(ss.Context(), "SubscribeToX509Bundles", req.GetReference(),
		func(_ *Workload, st *wapi.State) (proto.Message, error) {
			return &brokerpb.SubscribeToX509BundlesResponse{Bundles: x509Bundles(st, noTrustDomain)}, nil
		},
		func(m proto.Message) error { return ss.Send(m.(*brokerpb.SubscribeToX509BundlesResponse)) })
}

func (a *brokerAPI) SubscribeToJWTBundles(req *brokerpb.SubscribeToJWTBundlesRequest, ss grpc.ServerStreamingServer[brokerpb.SubscribeToJWTBundlesResponse]) error {
	return a.subscribe(ss.Context(), "SubscribeToJWTBundles", req.GetReference(),
		func(_ *Workload, st *wapi.State) (proto.Message, error) {
			b, err := jwtBundles(st)
			if err != nil {
				return nil, err
			}
			return &brokerpb.SubscribeToJWTBundlesResponse{Bundles: b}, nil
		},
		func(m proto.Message) error { return ss.Send(m.(*brokerpb.SubscribeToJWTBundlesResponse)) })
}

// x509SVIDMessage is the workload's SVID with its own trust domain's
// bundle, and the other trust domains it may trust as federated bundles
// (Broker API §5.2.1; Workload API §4.6).
func x509SVIDMessage(w *Workload, st *wapi.State) (proto.Message, error) {
	if err := hasSVID(w, st); err != nil {
		return nil, err
	}
	key, err := x509.MarshalPKCS8PrivateKey(st.SVID.Key)
	if err != nil {
		return nil, fmt.Errorf("broker: the private key of %s: %w", st.SVID.ID, err)
	}
	own := st.SVID.ID.TrustDomain()
	return &brokerpb.SubscribeToX509SVIDResponse{
		Svids: []*brokerpb.X509SVID{{
			SpiffeId:    st.SVID.ID.String(),
			X509Svid:    concatDER(st.SVID.Chain),
			X509SvidKey: key,
			Bundle:      ownBundle(st),
		}},
		FederatedBundles: x509Bundles(st, own),
	}, nil
}

// hasSVID refuses a State without the identity the workload resolved to
// (its certificate expired unrenewed, or the Source moved on).
func hasSVID(w *Workload, st *wapi.State) error {
	if st.SVID == nil || st.SVID.ID != w.ID {
		return status.Errorf(codes.PermissionDenied, "no identity issued for %s: its certificate for %s is not available (expired, or refused by the server)", w.Name, w.ID)
	}
	return nil
}

func (a *brokerAPI) FetchJWTSVID(ctx context.Context, req *brokerpb.FetchJWTSVIDRequest) (resp *brokerpb.FetchJWTSVIDResponse, err error) {
	c, err := a.s.begin(ctx, apiBroker, "FetchJWTSVID")
	var w *Workload
	defer func() { a.s.end(ctx, c, w, err) }()
	if err != nil {
		return nil, err
	}
	r, err := ParseReference(req.GetReference())
	if err != nil {
		return nil, a.s.status(ctx, c, err)
	}
	c.ref = r.String()
	if err := wapi.CheckAudience(req.GetAudience()); err != nil {
		return nil, err
	}
	var token string
	w, token, err = a.s.mint(ctx, c, r, req.GetAudience(), req.GetSpiffeId())
	if err != nil {
		return nil, err
	}
	return &brokerpb.FetchJWTSVIDResponse{Svids: []*brokerpb.JWTSVID{{SpiffeId: w.ID.String(), Svid: token}}}, nil
}

// mint resolves r and mints a JWT-SVID for its identity, which must be
// want when want is set. The workload is released before it returns (its
// ID stays for logs).
func (s *Server) mint(ctx context.Context, c *call, r Reference, audience []string, want string) (*Workload, string, error) {
	if s.cfg.JWT == nil {
		return nil, "", status.Error(codes.Unavailable, "JWT-SVIDs are not available from this agent")
	}
	w, err := s.resolve(ctx, c, &r)
	if err != nil {
		return nil, "", err
	}
	defer w.release()
	st, _ := w.Source.State()
	if err := hasSVID(w, st); err != nil {
		return w, "", err
	}
	if want != "" && want != w.ID.String() {
		return w, "", status.Errorf(codes.PermissionDenied, "%s is not entitled to %q: its identity is %s", w.Name, printable(want), w.ID)
	}
	token, err := s.cfg.JWT.MintJWTSVIDFor(ctx, w.ID, audience)
	if err != nil {
		return w, "", wapi.MintStatus(err)
	}
	s.served(ctx, c, w)
	return w, token, nil
}
