package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/pemfile"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

// waitFor bounds every wait of the demo.
const waitFor = 60 * time.Second

// demo is one run: its temp dir, its servers and its output.
type demo struct {
	o       options
	out     io.Writer
	dir     string
	step    int
	servers []*server
}

// server is a trustbridge server process.
type server struct {
	td        string
	dataDir   string
	admin     string // http://host:port
	bundleURL string
	log       string // file holding its stderr
	cmd       *exec.Cmd
	exited    chan struct{} // closed when the process has exited
	exitErr   error         // set before exited is closed
}

func (d *demo) say(format string, args ...any) {
	d.step++
	fmt.Fprintf(d.out, "%d. %s\n", d.step, fmt.Sprintf(format, args...))
}

func (d *demo) note(format string, args ...any) {
	fmt.Fprintf(d.out, "   %s\n", fmt.Sprintf(format, args...))
}

func run(ctx context.Context, o options, out io.Writer) (err error) {
	bin, err := filepath.Abs(o.bin)
	if err != nil {
		return err
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("%s: %w (run make build, or pass -bin)", o.bin, err)
	}
	o.bin = bin
	dir, err := os.MkdirTemp("", "trustbridge-demo-")
	if err != nil {
		return err
	}
	d := &demo{o: o, out: out, dir: dir}
	defer func() {
		if err != nil {
			for _, s := range d.servers {
				fmt.Fprintf(out, "--- last lines of %s's log:\n%s", s.td, tail(s.log, 15))
			}
		}
		d.cleanup()
	}()
	return d.play(ctx)
}

// play runs the demo's acts in order: two federated trust domains, a
// workload call across them, and the calls that must be refused. With
// -keep it then waits for keepCtx to end before stopping.
func (d *demo) play(keepCtx context.Context) error {
	ctx, cancel := context.WithTimeout(keepCtx, 5*time.Minute)
	defer cancel()
	east, west, webCA, err := d.startPeers(ctx)
	if err != nil {
		return err
	}
	if err := d.awaitFederation(ctx, east, west); err != nil {
		return err
	}
	w, err := d.issueWorkloads(ctx, east, west, webCA)
	if err != nil {
		return err
	}
	addr, stopServer, err := d.callAcross(ctx, w)
	if err != nil {
		return err
	}
	defer stopServer()
	north, err := d.refuseIntruder(ctx, addr, w)
	if err != nil {
		return err
	}
	if err := d.refuseWithoutRoots(ctx, addr, w); err != nil {
		return err
	}
	if d.o.keep {
		d.keepRunning(keepCtx, east, west, north)
	}
	d.say("done; stopping the servers and removing %s", d.dir)
	return nil
}

// startPeers starts east.example (https_spiffe) and west.example
// (https_web, with a certificate from a web CA of the demo's own), each
// federated with the other. webCA is the web CA's certificate file.
func (d *demo) startPeers(ctx context.Context) (east, west *server, webCA string, err error) {
	eastPort, westPort := freePort(), freePort()
	if eastPort == "" || westPort == "" {
		return nil, nil, "", errors.New("no free loopback port")
	}

	// west.example's bundle endpoint uses the https_web profile: a Web PKI
	// certificate. A private web CA stands in for a public one here; east
	// trusts it with --federation-ca-file.
	webCA, err = d.webPKI("127.0.0.1")
	if err != nil {
		return nil, nil, "", err
	}
	d.say("made a web CA and a certificate for 127.0.0.1, for west.example's https_web bundle endpoint")

	east, err = d.start(ctx, "east.example", eastPort,
		"--federate", "west.example|https://127.0.0.1:"+westPort+"/",
		"--federation-ca-file", webCA)
	if err != nil {
		return nil, nil, "", err
	}
	d.say("started east.example: self-signed CA, bundle endpoint %s (https_spiffe: it proves itself with an X509-SVID of its own CA)", east.bundleURL)

	fedConfig, err := d.handOverBundle(ctx, east)
	if err != nil {
		return nil, nil, "", err
	}

	west, err = d.start(ctx, "west.example", westPort,
		"--bundle-profile", "https_web",
		"--bundle-tls-cert", filepath.Join(d.dir, "web", "cert.pem"), "--bundle-tls-key", filepath.Join(d.dir, "web", "key.pem"),
		"--federation-config", fedConfig)
	if err != nil {
		return nil, nil, "", err
	}
	d.say("started west.example: bundle endpoint %s (https_web, the web CA's certificate)", west.bundleURL)
	return east, west, webCA, nil
}

// handOverBundle writes east's bundle and a federation config for west
// that names it, and returns the config's path. https_spiffe needs the
// peer's bundle once, out of band: it authenticates the first fetch.
// Here, it comes from east's admin API on loopback.
func (d *demo) handOverBundle(ctx context.Context, east *server) (string, error) {
	eastSnap, err := snapshot(ctx, east)
	if err != nil {
		return "", err
	}
	eastBundle, err := localBundle(eastSnap)
	if err != nil {
		return "", err
	}
	bundleFile := filepath.Join(d.dir, "east-bundle.json")
	if err := writeBundle(bundleFile, eastBundle); err != nil {
		return "", err
	}
	fedConfig := filepath.Join(d.dir, "west-federation.yaml")
	if err := os.WriteFile(fedConfig, []byte(fmt.Sprintf(`federation:
  - trustDomain: east.example
    bundleEndpointURL: %s
    bundleEndpointProfile:
      type: https_spiffe
      endpointSPIFFEID: spiffe://east.example/trustbridge/bundle-endpoint
    trustDomainBundleFile: %s
`, east.bundleURL, bundleFile)), 0o600); err != nil {
		return "", err
	}
	d.say("handed east.example's bundle to west.example out of band (%d root, sequence %d): it authenticates west's first fetch",
		len(eastBundle.X509Authorities()), seq(eastBundle))
	return fedConfig, nil
}

// awaitFederation waits until each of east and west has fetched the
// other's bundle.
func (d *demo) awaitFederation(ctx context.Context, east, west *server) error {
	// East has been polling west since it started, with backoff; ask for
	// a poll now rather than wait.
	_ = d.cli(ctx, "federation", "refresh", "west.example", "--admin", east.admin)
	for _, f := range []struct {
		s    *server
		peer string
		how  string
	}{{west, "east.example", "https_spiffe"}, {east, "west.example", "https_web"}} {
		st, err := waitFederated(ctx, f.s, f.peer)
		if err != nil {
			return err
		}
		d.say("%s fetched %s's bundle over %s: sequence %s, %d root(s), state %s", f.s.td, f.peer, f.how, seqText(st.Sequence), x509Count(st), st.State)
	}
	return nil
}

// workloads are the demo's two workloads and the trust each takes from
// its own server.
type workloads struct {
	frontend, backend    *x509svid.SVID // east's and west's
	eastTrust, westTrust *x509bundle.Set
}

// issueWorkloads issues a workload certificate in each trust domain, from
// its own CA, and fetches each server's bundle map as its workload's
// trust.
func (d *demo) issueWorkloads(ctx context.Context, east, west *server, webCA string) (workloads, error) {
	var w workloads
	eastCreds, westCreds := filepath.Join(d.dir, "east-frontend"), filepath.Join(d.dir, "west-backend")
	if err := d.cli(ctx, "ca", "issue", "--data-dir", east.dataDir, "--spiffe-id", "spiffe://east.example/frontend", "--credentials-dir", eastCreds); err != nil {
		return w, err
	}
	if err := d.cli(ctx, "ca", "issue", "--data-dir", west.dataDir, "--spiffe-id", "spiffe://west.example/backend", "--credentials-dir", westCreds); err != nil {
		return w, err
	}
	d.say("issued spiffe://east.example/frontend (east's CA) and spiffe://west.example/backend (west's CA)")

	// Each workload trusts what its own server trusts: the bundle map its
	// bundle endpoint serves, fetched with its own trust.
	var err error
	w.eastTrust, err = bundleMap(ctx, east.bundleURL+"bundle-map", ownEndpointTLS(eastCreds, "spiffe://east.example/trustbridge/bundle-endpoint"))
	if err != nil {
		return w, fmt.Errorf("east's bundle map: %w", err)
	}
	w.westTrust, err = bundleMap(ctx, west.bundleURL+"bundle-map", webTLS(webCA))
	if err != nil {
		return w, fmt.Errorf("west's bundle map: %w", err)
	}
	d.say("each workload took its trust from its own server's /bundle-map: east trusts %s; west trusts %s", tds(w.eastTrust), tds(w.westTrust))

	w.frontend, err = x509svid.Load(filepath.Join(eastCreds, "cert-chain.pem"), filepath.Join(eastCreds, "key.pem"))
	if err != nil {
		return w, err
	}
	w.backend, err = x509svid.Load(filepath.Join(westCreds, "cert-chain.pem"), filepath.Join(westCreds, "key.pem"))
	if err != nil {
		return w, err
	}
	return w, nil
}

// callAcross serves west's backend over mTLS at addr and calls it from
// east's frontend. The caller stops the backend with stop once it is no
// longer needed; on an error it is already stopped.
func (d *demo) callAcross(ctx context.Context, w workloads) (addr string, stop func(), err error) {
	// west's backend accepts east's frontend only; each side verifies the
	// other against the roots of the other's trust domain only.
	addr, peers, stop, err := serveMTLS(w.backend, w.westTrust, tlsconfig.AuthorizeID(w.frontend.ID))
	if err != nil {
		return "", nil, err
	}
	reply, err := dialMTLS(ctx, addr, w.frontend, w.eastTrust, tlsconfig.AuthorizeID(w.backend.ID))
	if err != nil {
		stop()
		return "", nil, fmt.Errorf("east → west mTLS: %w", err)
	}
	d.say("mTLS east.example/frontend → west.example/backend succeeded: %q", reply)
	d.note("the backend saw %s, verified with west's copy of east.example's roots", <-peers)
	return addr, stop, nil
}

// refuseIntruder starts north.example, a real CA of its own federated
// with nobody, and checks that west's backend at addr refuses its
// workload.
func (d *demo) refuseIntruder(ctx context.Context, addr string, w workloads) (*server, error) {
	north, err := d.start(ctx, "north.example", freePort())
	if err != nil {
		return nil, err
	}
	northCreds := filepath.Join(d.dir, "north-intruder")
	if err := d.cli(ctx, "ca", "issue", "--data-dir", north.dataDir, "--spiffe-id", "spiffe://north.example/frontend", "--credentials-dir", northCreds); err != nil {
		return nil, err
	}
	intruder, err := x509svid.Load(filepath.Join(northCreds, "cert-chain.pem"), filepath.Join(northCreds, "key.pem"))
	if err != nil {
		return nil, err
	}
	northTrust := x509bundle.NewSet(x509bundle.FromX509Authorities(spiffeid.RequireTrustDomainFromString("north.example"), intruder.Certificates[len(intruder.Certificates)-1:]))
	for _, b := range w.westTrust.Bundles() {
		northTrust.Add(b) // even trusting west's roots does not help it
	}
	_, err = dialMTLS(ctx, addr, intruder, northTrust, tlsconfig.AuthorizeAny())
	if err == nil {
		return nil, errors.New("north.example's workload was accepted by west.example's backend")
	}
	d.say("mTLS north.example/frontend → west.example/backend refused, as it must be: west trusts no root of north.example")
	d.note("%v", err)
	return north, nil
}

// refuseWithoutRoots checks that east's frontend, holding only east's
// own roots, cannot verify west's backend at addr.
func (d *demo) refuseWithoutRoots(ctx context.Context, addr string, w workloads) error {
	_, err := dialMTLS(ctx, addr, w.frontend, x509bundle.NewSet(w.eastTrust.Bundles()[0]), tlsconfig.AuthorizeID(w.backend.ID))
	if err == nil {
		return errors.New("a client without west.example's roots accepted west's backend")
	}
	d.say("and a client that holds only east.example's own roots cannot verify west's backend either: roots never cross trust domains")
	return nil
}

// keepRunning shows where to look around and waits for keepCtx to end.
func (d *demo) keepRunning(keepCtx context.Context, east, west, north *server) {
	d.say("the servers keep running (-keep) until Ctrl-C; look around:")
	d.note("status pages: east %s/ui  west %s/ui  north %s/ui", east.admin, west.admin, north.admin)
	d.note("%s audit --admin %s", d.o.bin, west.admin)
	d.note("%s federation status --admin %s", d.o.bin, east.admin)
	d.note("%s audit log verify %s", d.o.bin, filepath.Join(west.dataDir, "audit.jsonl"))
	<-keepCtx.Done()
}

// start runs a trustbridge server for td and waits until it is ready.
func (d *demo) start(ctx context.Context, td, bundlePort string, extra ...string) (*server, error) {
	s := &server{td: td, dataDir: filepath.Join(d.dir, td), log: filepath.Join(d.dir, td+".log"), exited: make(chan struct{})}
	args := append([]string{"server", "--trust-domain", td, "--data-dir", s.dataDir, "--init",
		"--admin-listen", "127.0.0.1:0", "--bundle-listen", "127.0.0.1:" + bundlePort, "--grpc-listen", "",
		"--federation-allow-private", "--federation-min-refresh", "1s", "--bundle-refresh-hint", "1m",
		"--log-format", "json"}, extra...)
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	s.cmd = exec.Command(d.o.bin, args...)
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	logs, err := s.cmd.StderrPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	d.servers = append(d.servers, s)
	started := make(chan startRecords, 1)
	go func() {
		defer logf.Close()
		started <- readStart(io.TeeReader(logs, logf))
		_, _ = io.Copy(logf, logs)
		// Wait closes the pipe: only once everything is read.
		s.exitErr = s.cmd.Wait()
		close(s.exited)
	}()
	select {
	case rec := <-started:
		s.admin, s.bundleURL = rec.admin, rec.bundleURL
	case <-time.After(waitFor):
		return nil, fmt.Errorf("%s did not start within %s", td, waitFor)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if s.admin == "" || s.bundleURL == "" {
		<-s.exited // the log ended: the process is ending
		return nil, fmt.Errorf("%s exited: %v", td, s.exitErr)
	}
	return s, waitUntil(ctx, func() bool {
		resp, err := http.Get(s.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, td+" ready")
}

// startRecords are what a server's JSON start-up records say: its admin
// URL and its bundle endpoint's URL.
type startRecords struct{ admin, bundleURL string }

// readStart reads JSON log lines from r until the start-up records named
// both addresses, or r ends (then it returns what it found).
func readStart(r io.Reader) startRecords {
	var rec startRecords
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line struct {
			Msg   string `json:"msg"`
			Admin string `json:"admin"`
			URL   string `json:"endpoint_url"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil {
			continue
		}
		switch line.Msg {
		case "trustbridge server started":
			rec.admin = line.Admin
		case "bundle endpoint: peers federate with this tuple":
			rec.bundleURL = line.URL
		}
		if rec.admin != "" && rec.bundleURL != "" {
			return rec
		}
	}
	return rec
}

// cli runs a trustbridge command and returns its error with its output.
func (d *demo) cli(ctx context.Context, args ...string) error {
	cctx, cancel := context.WithTimeout(ctx, waitFor)
	defer cancel()
	out, err := exec.CommandContext(cctx, d.o.bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("trustbridge %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// cleanup stops every server (SIGTERM to its process group, then SIGKILL)
// and removes the temp dir.
func (d *demo) cleanup() {
	for _, s := range d.servers {
		if s.cmd.Process == nil {
			continue
		}
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-s.exited
		}
	}
	_ = os.RemoveAll(d.dir)
}

func waitUntil(ctx context.Context, cond func() bool, what string) error {
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", waitFor, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

func getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	body, err := bundledoc.ReadLimited(resp.Body, 16<<20)
	if err != nil {
		return err
	}
	return json.Unmarshal(body, v)
}

func snapshot(ctx context.Context, s *server) (api.Snapshot, error) {
	var snap api.Snapshot
	return snap, getJSON(ctx, s.admin+"/v1/snapshot", &snap)
}

// fedStatus is the part of /v1/federation the demo reads.
type fedStatus struct {
	TrustDomain string  `json:"trust_domain"`
	State       string  `json:"state"`
	Sequence    *uint64 `json:"sequence"`
	Authorities []struct {
		Kind string `json:"kind"`
	} `json:"authorities"`
}

func waitFederated(ctx context.Context, s *server, peer string) (fedStatus, error) {
	var st fedStatus
	err := waitUntil(ctx, func() bool {
		var all []fedStatus
		if getJSON(ctx, s.admin+"/v1/federation", &all) != nil {
			return false
		}
		for _, f := range all {
			if f.TrustDomain == peer && f.State == "ok" {
				st = f
				return true
			}
		}
		return false
	}, s.td+" to fetch "+peer+"'s bundle")
	return st, err
}

// localBundle is the local trust domain's bundle from a snapshot.
func localBundle(snap api.Snapshot) (*spiffebundle.Bundle, error) {
	for _, td := range snap.TrustDomains {
		if !td.Local {
			continue
		}
		// The whole bundle, JWT authorities too: the peer refuses a later
		// fetch of the same sequence with other authorities.
		b := spiffebundle.New(spiffeid.RequireTrustDomainFromString(td.Name))
		for _, a := range td.Authorities {
			if err := addAuthority(b, a); err != nil {
				return nil, err
			}
		}
		if td.Sequence != nil {
			b.SetSequenceNumber(*td.Sequence)
		}
		return b, nil
	}
	return nil, errors.New("snapshot has no local trust domain")
}

func addAuthority(b *spiffebundle.Bundle, a api.Authority) error {
	switch a.Kind {
	case api.KindX509:
		c, err := x509.ParseCertificate(a.Certificate)
		if err != nil {
			return err
		}
		b.AddX509Authority(c)
	case api.KindJWT:
		pub, err := x509.ParsePKIXPublicKey(a.PublicKey)
		if err != nil {
			return fmt.Errorf("JWT authority %q: %w", a.KeyID, err)
		}
		return b.AddJWTAuthority(a.KeyID, pub)
	}
	return nil
}

func writeBundle(path string, b *spiffebundle.Bundle) error {
	doc, err := bundledoc.Marshal(b)
	if err != nil {
		return err
	}
	return os.WriteFile(path, doc, 0o644)
}

// bundleMap fetches a bundle map over TLS and returns it as a set.
func bundleMap(ctx context.Context, url string, cfg *tls.Config) (*x509bundle.Set, error) {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	bundles, _, err := bundledoc.ReadMap(resp.Body, 16<<20)
	if err != nil {
		return nil, err
	}
	set := x509bundle.NewSet()
	for _, b := range bundles {
		set.Add(b.X509Bundle())
	}
	return set, nil
}

// ownEndpointTLS trusts the workload's own roots (root-cert.pem from ca
// issue) and the endpoint's SPIFFE ID: the https_spiffe profile.
func ownEndpointTLS(creds, endpointID string) *tls.Config {
	roots, _ := os.ReadFile(filepath.Join(creds, "root-cert.pem"))
	// Errors are ignored, as for the read: without roots the request
	// fails with a TLS error that names the problem.
	certs, _ := pemfile.ParseCertificates(roots)
	id := spiffeid.RequireFromString(endpointID)
	return tlsconfig.TLSClientConfig(x509bundle.FromX509Authorities(id.TrustDomain(), certs), tlsconfig.AuthorizeID(id))
}

func webTLS(caFile string) *tls.Config {
	pool := x509.NewCertPool()
	data, _ := os.ReadFile(caFile)
	pool.AppendCertsFromPEM(data)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// serveMTLS runs a one-message mTLS server for svid; peers receives each
// verified client ID.
func serveMTLS(svid *x509svid.SVID, trust *x509bundle.Set, authorize tlsconfig.Authorizer) (string, <-chan string, func(), error) {
	ln, err := tls.Listen("tcp", "127.0.0.1:0", tlsconfig.MTLSServerConfig(svid, trust, authorize))
	if err != nil {
		return "", nil, nil, err
	}
	peers := make(chan string, 16)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
				tc := conn.(*tls.Conn)
				if err := tc.Handshake(); err != nil {
					return
				}
				id, err := x509svid.IDFromCert(tc.ConnectionState().PeerCertificates[0])
				if err != nil {
					return
				}
				select {
				case peers <- id.String():
				default:
				}
				_, _ = io.WriteString(conn, "hello "+id.String()+", this is "+svid.ID.String()+"\n")
			}()
		}
	}()
	return ln.Addr().String(), peers, func() { _ = ln.Close() }, nil
}

func dialMTLS(ctx context.Context, addr string, svid *x509svid.SVID, trust *x509bundle.Set, authorize tlsconfig.Authorizer) (string, error) {
	d := tls.Dialer{Config: tlsconfig.MTLSClientConfig(svid, trust, authorize)}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		// TLS 1.3: the server's refusal of our certificate arrives with
		// the first read.
		return "", err
	}
	return strings.TrimSpace(line), nil
}

// webPKI writes a web CA and a server certificate for host into the demo
// dir; it returns the CA file.
func (d *demo) webPKI(host string) (string, error) {
	dir := filepath.Join(d.dir, "web")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "trustbridge demo web CA"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return "", err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	leafTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: host},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour), IPAddresses: []net.IP{net.ParseIP(host)},
		DNSNames: []string{"localhost"}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return "", err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", err
	}
	files := []struct {
		name, typ string
		der       []byte
		perm      os.FileMode
	}{{"ca.pem", "CERTIFICATE", caDER, 0o644}, {"cert.pem", "CERTIFICATE", leafDER, 0o644}, {"key.pem", "PRIVATE KEY", keyDER, 0o600}}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.name), pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), f.perm); err != nil {
			return "", err
		}
	}
	return filepath.Join(dir, "ca.pem"), nil
}

func freePort() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return ""
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

func seq(b *spiffebundle.Bundle) uint64 {
	s, _ := b.SequenceNumber()
	return s
}

func seqText(s *uint64) string {
	if s == nil {
		return "none"
	}
	return fmt.Sprint(*s)
}

func x509Count(st fedStatus) int {
	n := 0
	for _, a := range st.Authorities {
		if a.Kind == "x509" {
			n++
		}
	}
	return n
}

func tds(set *x509bundle.Set) string {
	var names []string
	for _, b := range set.Bundles() {
		names = append(names, b.TrustDomain().Name())
	}
	return strings.Join(names, " and ")
}

func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n") + "\n"
}
