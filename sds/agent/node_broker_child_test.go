//go:build linux

package agent

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	brokerpb "github.com/spiffe/go-spiffe/v2/exp/proto/spiffe/broker"
	"github.com/spiffe/go-spiffe/v2/spiffegrpc/grpccredentials"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	delegatedv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/agent/delegatedidentity/v1"
	spiretypes "github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/trustbridge/trustbridge/sds/broker"
)

// childBrokerEnv is the broker socket a child calls with cmdBroker.
const childBrokerEnv = "TRUSTBRIDGE_AGENT_CHILD_BROKER"

// cmdBroker, followed by a brokerCall as JSON, makes the child a broker:
// it calls the broker socket for the workload the call names, through
// go-spiffe's Broker API client or spire-api-sdk's Delegated Identity API
// client, and reports what it got (a stream: every message, then its end).
const cmdBroker = "broker"

// brokerCall is one call a child broker makes.
type brokerCall struct {
	// Label names the answers' stream.
	Label string `json:"label"`
	// Delegated calls SPIRE's Delegated Identity API, else the Broker API.
	Delegated bool `json:"delegated,omitempty"`
	// JWT fetches a JWT-SVID for Audience; else an X509-SVID stream.
	JWT      bool   `json:"jwt,omitempty"`
	Audience string `json:"audience,omitempty"`
	// The workload: PID, or a Pod by namespace and name, or UID, or a
	// ServiceAccount by namespace and name; for the Delegated Identity
	// API, Selectors ("type:value") in place of a pid.
	PID            int32    `json:"pid,omitempty"`
	Namespace, Pod string   `json:",omitempty"`
	UID            string   `json:"uid,omitempty"`
	ServiceAccount string   `json:"sa,omitempty"`
	Selectors      []string `json:"selectors,omitempty"`
	// MTLS connects with mutual TLS: the child's X509-SVID from the
	// node's Workload API, authorising the agent as Server.
	MTLS   bool   `json:"mtls,omitempty"`
	Server string `json:"server,omitempty"`
}

func (c brokerCall) command() string {
	b, _ := json.Marshal(c)
	return cmdBroker + " " + string(b)
}

// childBroker makes call and reports each answer until ctx ends.
func childBroker(ctx context.Context, call brokerCall, report func(childLine)) {
	l := childLine{Stream: call.Label}
	creds, err := call.credentials(ctx)
	if err != nil {
		report(l.refused(err))
		return
	}
	conn, err := grpc.NewClient("unix://"+os.Getenv(childBrokerEnv), grpc.WithTransportCredentials(creds))
	if err != nil {
		report(l.refused(err))
		return
	}
	defer conn.Close()
	if call.Delegated {
		err = childDelegated(ctx, conn, call, report)
	} else {
		err = childBrokerAPI(metadata.AppendToOutgoingContext(ctx, broker.Header, "true"), conn, call, report)
	}
	if ctx.Err() == nil {
		report(l.refused(err))
	}
}

// credentials are the call's transport: plaintext, or mutual TLS with the
// child's own X509-SVID as a broker gets it from the Workload API.
func (c brokerCall) credentials(ctx context.Context) (credentials.TransportCredentials, error) {
	if !c.MTLS {
		return insecure.NewCredentials(), nil
	}
	server, err := spiffeid.FromString(c.Server)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, childCallLimit)
	defer cancel()
	x, err := workloadapi.FetchX509Context(ctx, workloadapi.WithAddr("unix://"+os.Getenv(childWLEnv)))
	if err != nil {
		return nil, fmt.Errorf("the broker's own SVID: %w", err)
	}
	return grpccredentials.MTLSClientCredentials(x.DefaultSVID(), x.Bundles, tlsconfig.AuthorizeID(server)), nil
}

func (c brokerCall) reference() (*brokerpb.WorkloadReference, error) {
	if c.PID != 0 {
		a, err := anypb.New(&brokerpb.WorkloadPIDReference{Pid: c.PID})
		return &brokerpb.WorkloadReference{Reference: a}, err
	}
	if c.ServiceAccount != "" {
		a, err := anypb.New(&brokerpb.KubernetesObjectReference{Type: &brokerpb.KubernetesObjectType{Plural: "serviceaccounts", Group: "core"},
			Key: &brokerpb.KubernetesObjectKey{Namespace: c.Namespace, Name: c.ServiceAccount}})
		return &brokerpb.WorkloadReference{Reference: a}, err
	}
	k := &brokerpb.KubernetesObjectReference{Type: &brokerpb.KubernetesObjectType{Plural: "pods", Group: "core"}, Uid: c.UID}
	if c.Pod != "" {
		k.Key = &brokerpb.KubernetesObjectKey{Namespace: c.Namespace, Name: c.Pod}
	}
	a, err := anypb.New(k)
	return &brokerpb.WorkloadReference{Reference: a}, err
}

func childBrokerAPI(ctx context.Context, conn *grpc.ClientConn, call brokerCall, report func(childLine)) error {
	ref, err := call.reference()
	if err != nil {
		return err
	}
	c := brokerpb.NewAPIClient(conn)
	if call.JWT {
		resp, err := c.FetchJWTSVID(ctx, &brokerpb.FetchJWTSVIDRequest{Reference: ref, Audience: []string{call.Audience}})
		if err != nil {
			return err
		}
		for _, s := range resp.GetSvids() {
			report(childLine{Stream: call.Label, ID: s.GetSpiffeId(), Token: s.GetSvid()})
		}
		<-ctx.Done()
		return nil
	}
	s, err := c.SubscribeToX509SVID(ctx, &brokerpb.SubscribeToX509SVIDRequest{Reference: ref})
	for err == nil {
		var resp *brokerpb.SubscribeToX509SVIDResponse
		if resp, err = s.Recv(); err == nil {
			report(brokerLine(call.Label, resp))
		}
	}
	return err
}

// brokerLine reports a Broker API X509-SVID message as watchLine reports
// the Workload API's.
func brokerLine(label string, resp *brokerpb.SubscribeToX509SVIDResponse) childLine {
	l := childLine{Stream: label}
	if len(resp.GetSvids()) != 1 {
		return l.refused(fmt.Errorf("%d SVIDs, want 1", len(resp.GetSvids())))
	}
	svid := resp.GetSvids()[0]
	if l = l.svid(svid.GetSpiffeId(), svid.GetBundle(), resp.GetFederatedBundles()); l.Code != "" {
		return l
	}
	chain, err := x509.ParseCertificates(svid.GetX509Svid())
	if err != nil {
		return l.refused(err)
	}
	l.Serial = chain[0].SerialNumber.String()
	return l
}

func childDelegated(ctx context.Context, conn *grpc.ClientConn, call brokerCall, report func(childLine)) error {
	c := delegatedv1.NewDelegatedIdentityClient(conn)
	if call.JWT {
		resp, err := c.FetchJWTSVIDs(ctx, &delegatedv1.FetchJWTSVIDsRequest{Pid: call.PID, Audience: []string{call.Audience}})
		if err != nil {
			return err
		}
		for _, s := range resp.GetSvids() {
			report(childLine{Stream: call.Label, ID: "spiffe://" + s.GetId().GetTrustDomain() + s.GetId().GetPath(), Token: s.GetToken()})
		}
		<-ctx.Done()
		return nil
	}
	var sels []*spiretypes.Selector
	for _, v := range call.Selectors {
		typ, value, _ := strings.Cut(v, ":")
		sels = append(sels, &spiretypes.Selector{Type: typ, Value: value})
	}
	s, err := c.SubscribeToX509SVIDs(ctx, &delegatedv1.SubscribeToX509SVIDsRequest{Pid: call.PID, Selectors: sels})
	for err == nil {
		var resp *delegatedv1.SubscribeToX509SVIDsResponse
		if resp, err = s.Recv(); err == nil {
			l := childLine{Stream: call.Label}
			for _, svid := range resp.GetX509Svids() {
				l.ID = "spiffe://" + svid.GetX509Svid().GetId().GetTrustDomain() + svid.GetX509Svid().GetId().GetPath()
			}
			l.FederatesWith = resp.GetFederatesWith()
			report(l)
		}
	}
	return err
}
