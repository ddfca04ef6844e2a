//go:build linux

package agent

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/trustbridge/trustbridge/internal/pemfile"
	"github.com/trustbridge/trustbridge/sds"
)

// The test binary re-executed as a workload of the node (childMain): a
// process the parent moves into a pod's cgroup before telling it, on
// stdin, what to ask the node agent; it prints each answer as a JSON line
// (childLine) for the parent to check. Attestation looks at the calling
// process, so what a pod gets can only be asked from a process in it.
const (
	childEnv       = "TRUSTBRIDGE_AGENT_CHILD" // set: run as a child
	childSDSEnv    = "TRUSTBRIDGE_AGENT_CHILD_SDS"
	childWLEnv     = "TRUSTBRIDGE_AGENT_CHILD_WORKLOAD_API"
	childCallLimit = 30 * time.Second // bounds a child's one-shot call, so a broken test fails
)

// Child commands, one a line on its stdin; EOF ends the child.
const (
	// cmdX509 fetches an X.509 context once through go-spiffe's Workload
	// API client.
	cmdX509 = "x509"
	// cmdSDS opens two SDS streams as Istio's Envoy does, one for
	// default and one for ROOTCA, and reports every response until EOF.
	cmdSDS = "sds"
	// cmdWatch opens a Workload API FetchX509SVID stream and reports
	// every response, and its end, until EOF.
	cmdWatch = "watch"
)

// childLine is one answer a child got: Stream names what was asked
// (cmdX509, or the SDS resource name); Code and Msg are a refusal's;
// otherwise ID is the SVID's (or default's leaf's) SPIFFE ID and Roots the
// trust it was given, by trust domain, as root fingerprints.
type childLine struct {
	Stream   string              `json:"stream"`
	Code     string              `json:"code,omitempty"`
	Msg      string              `json:"msg,omitempty"`
	ID       string              `json:"id,omitempty"`
	DNSNames []string            `json:"dnsNames,omitempty"` // the X509-SVID's
	Verified bool                `json:"verified,omitempty"` // the SVID verifies against the bundles given with it
	Roots    map[string][]string `json:"roots,omitempty"`
	// A broker's answers (cmdBroker): the leaf's serial, a JWT-SVID, the
	// Delegated Identity API's federates_with.
	Serial        string   `json:"serial,omitempty"`
	Token         string   `json:"token,omitempty"`
	FederatesWith []string `json:"federatesWith,omitempty"`
}

// childHandoff, as childEnv's value, makes the child connect to the SDS
// socket, hand the connection to the parent over fd 3 and exit (see
// runHandoff).
const childHandoff = "handoff"

// childMain runs the child when the test binary was started as one.
func childMain() (int, bool) {
	switch os.Getenv(childEnv) {
	case "":
		return 0, false
	case childHandoff:
		if err := runHandoff(os.Getenv(childSDSEnv), os.NewFile(3, "handoff")); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 1, true
		}
		return 0, true
	}
	return runChild(os.Stdin, os.Stdout), true
}

// runHandoff connects to the unix socket at path, waits until the server
// has accepted the connection (its first bytes, the HTTP/2 SETTINGS,
// peeked, not read: the server pins the caller during its handshake,
// before it writes), and sends the connection over the unix socket to
// (SCM_RIGHTS). The connection stays one this process made after it
// exits.
func runHandoff(path string, to *os.File) error {
	conn, err := net.Dial("unix", path)
	if err != nil {
		return err
	}
	defer conn.Close()
	f, err := conn.(*net.UnixConn).File()
	if err != nil {
		return err
	}
	defer f.Close()
	if _, _, err := unix.Recvfrom(int(f.Fd()), make([]byte, 1), unix.MSG_PEEK); err != nil {
		return fmt.Errorf("waiting for the server: %w", err)
	}
	c, err := net.FileConn(to)
	if err != nil {
		return err
	}
	defer c.Close()
	_, _, err = c.(*net.UnixConn).WriteMsgUnix([]byte{0}, unix.UnixRights(int(f.Fd())), nil)
	return err
}

func runChild(in io.Reader, out io.Writer) int {
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	report := func(l childLine) {
		mu.Lock()
		defer mu.Unlock()
		b, _ := json.Marshal(l)
		fmt.Fprintln(out, string(b))
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		switch cmd := sc.Text(); cmd {
		case cmdX509:
			report(childX509(ctx, os.Getenv(childWLEnv)))
		case cmdSDS:
			for _, name := range []string{sds.DefaultName, sds.RootCAName} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					childSDS(ctx, os.Getenv(childSDSEnv), name, report)
				}()
			}
		case cmdWatch:
			wg.Add(1)
			go func() {
				defer wg.Done()
				childWatch(ctx, os.Getenv(childWLEnv), report)
			}()
		case brokerCommand(cmd):
			var call brokerCall
			if err := json.Unmarshal([]byte(cmd[len(cmdBroker)+1:]), &call); err != nil {
				fmt.Fprintf(os.Stderr, "child: %q: %v\n", cmd, err)
				cancel()
				return 2
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				childBroker(ctx, call, report)
			}()
		default:
			fmt.Fprintf(os.Stderr, "child: unknown command %q\n", cmd)
			cancel()
			return 2
		}
	}
	cancel()
	wg.Wait()
	return 0
}

// childX509 asks the Workload API for the caller's X.509 context once.
func childX509(ctx context.Context, socket string) childLine {
	ctx, cancel := context.WithTimeout(ctx, childCallLimit)
	defer cancel()
	l := childLine{Stream: cmdX509}
	c, err := workloadapi.New(ctx, workloadapi.WithAddr("unix://"+socket))
	if err != nil {
		return l.refused(err)
	}
	defer c.Close()
	x, err := c.FetchX509Context(ctx)
	if err != nil {
		return l.refused(err)
	}
	if len(x.SVIDs) != 1 {
		return l.refused(fmt.Errorf("%d SVIDs, want 1", len(x.SVIDs)))
	}
	l.ID = x.SVIDs[0].ID.String()
	l.DNSNames = x.SVIDs[0].Certificates[0].DNSNames
	_, _, err = x509svid.Verify(x.SVIDs[0].Certificates, x.Bundles)
	l.Verified = err == nil
	l.Roots = map[string][]string{}
	for _, b := range x.Bundles.Bundles() {
		l.Roots[b.TrustDomain().Name()] = fingerprints(b.X509Authorities())
	}
	return l
}

// childWatch streams the caller's X509-SVIDs from the Workload API until
// ctx ends, reporting each response's SVID and the stream's end.
func childWatch(ctx context.Context, socket string, report func(childLine)) {
	l := childLine{Stream: cmdWatch}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		report(l.refused(err))
		return
	}
	defer conn.Close()
	s, err := workloadpb.NewSpiffeWorkloadAPIClient(conn).FetchX509SVID(metadata.AppendToOutgoingContext(ctx, "workload.spiffe.io", "true"), &workloadpb.X509SVIDRequest{})
	for err == nil {
		var resp *workloadpb.X509SVIDResponse
		if resp, err = s.Recv(); err == nil {
			report(watchLine(resp))
		}
	}
	if ctx.Err() == nil {
		report(l.refused(err))
	}
}

// watchLine reports a FetchX509SVID response: its SVID's ID, and the
// roots of its own trust domain and of the federated ones.
func watchLine(resp *workloadpb.X509SVIDResponse) childLine {
	l := childLine{Stream: cmdWatch}
	if len(resp.GetSvids()) != 1 {
		return l.refused(fmt.Errorf("%d SVIDs, want 1", len(resp.GetSvids())))
	}
	svid := resp.GetSvids()[0]
	return l.svid(svid.GetSpiffeId(), svid.GetBundle(), resp.GetFederatedBundles())
}

// svid reports an X509-SVID message's ID and the roots of its own trust
// domain (own, DER) and of the federated ones (by trust domain ID).
func (l childLine) svid(spiffeID string, own []byte, federated map[string][]byte) childLine {
	id, err := spiffeid.FromString(spiffeID)
	if err != nil {
		return l.refused(err)
	}
	l.ID = id.String()
	bundles := map[string][]byte{id.TrustDomain().Name(): own}
	for name, der := range federated {
		td, err := spiffeid.TrustDomainFromString(name)
		if err != nil {
			return l.refused(err)
		}
		bundles[td.Name()] = der
	}
	l.Roots = map[string][]string{}
	for td, der := range bundles {
		certs, err := x509.ParseCertificates(der)
		if err != nil {
			return l.refused(fmt.Errorf("bundle of %s: %w", td, err))
		}
		l.Roots[td] = fingerprints(certs)
	}
	return l
}

// childSDS streams name until ctx ends, reporting each response (ACKed)
// and the stream's end, as Envoy would see them.
func childSDS(ctx context.Context, socket, name string, report func(childLine)) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		report(childLine{Stream: name}.refused(err))
		return
	}
	defer conn.Close()
	s, err := secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
	if err == nil {
		err = s.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "sidecar"}, TypeUrl: resourcev3.SecretType, ResourceNames: []string{name}})
	}
	for err == nil {
		var resp *discoveryv3.DiscoveryResponse
		if resp, err = s.Recv(); err != nil {
			break
		}
		report(sdsLine(name, resp))
		err = s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.SecretType, ResourceNames: []string{name},
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
	}
	if ctx.Err() == nil {
		report(childLine{Stream: name}.refused(err))
	}
}

// sdsLine reports the secret name of resp: default's leaf ID, or the
// trust domains and roots of ROOTCA's SPIFFE validator.
func sdsLine(name string, resp *discoveryv3.DiscoveryResponse) childLine {
	l := childLine{Stream: name}
	if len(resp.GetResources()) != 1 {
		return l.refused(fmt.Errorf("%d resources, want 1", len(resp.GetResources())))
	}
	var s tlsv3.Secret
	if err := anypb.UnmarshalTo(resp.GetResources()[0], &s, proto.UnmarshalOptions{}); err != nil {
		return l.refused(err)
	}
	switch name {
	case sds.DefaultName:
		certs, err := pemfile.ParseCertificates(s.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
		if err != nil {
			return l.refused(err)
		}
		id, err := x509svid.IDFromCert(certs[0])
		if err != nil {
			return l.refused(err)
		}
		l.ID = id.String()
	default:
		byTD, err := parseSPIFFEValidator(s.GetValidationContext())
		if err != nil {
			return l.refused(err)
		}
		l.Roots = rootsByName(byTD)
	}
	return l
}

// brokerCommand is cmd when it is a cmdBroker line, so that the
// command switch can match it.
func brokerCommand(cmd string) string {
	if strings.HasPrefix(cmd, cmdBroker+" ") {
		return cmd
	}
	return "\x00"
}

func (l childLine) refused(err error) childLine {
	st := status.Convert(err)
	l.Code, l.Msg = st.Code().String(), st.Message()
	return l
}

// fingerprints are the SHA-256 of certs, sorted.
func fingerprints(certs []*x509.Certificate) []string {
	out := make([]string, 0, len(certs))
	for _, c := range certs {
		sum := sha256.Sum256(c.Raw)
		out = append(out, hex.EncodeToString(sum[:]))
	}
	slices.Sort(out)
	return out
}

func rootsByName(byTD map[spiffeid.TrustDomain][]*x509.Certificate) map[string][]string {
	out := make(map[string][]string, len(byTD))
	for td, certs := range byTD {
		out[td.Name()] = fingerprints(certs)
	}
	return out
}

// bundleRoots is what a child reports for bundles.
func bundleRoots(bundles ...*x509bundle.Bundle) map[string][]string {
	out := make(map[string][]string, len(bundles))
	for _, b := range bundles {
		out[b.TrustDomain().Name()] = fingerprints(b.X509Authorities())
	}
	return out
}
