package istiotest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	pkiutil "istio.io/istio/security/pkg/pki/util"

	"github.com/trustbridge/trustbridge/ca"
)

// benchRounds is how many times each sub-benchmark alternates the baseline
// and the Istio clients, b.N/benchRounds certificates each, so that a burst of
// load from elsewhere on a shared machine falls on both.
const benchRounds = 3

// BenchmarkIstioClientThroughput (issue 15, item 4): CreateCertificate from
// Istio's own CA client (the istio-agent's citadel client) in a separate
// process, cmd/istioload, against bin/trustbridge in another, at 1, 8 and 64
// concurrent clients, each with its own connection. One op is one
// certificate. The clients send a key and CSR generated once per client
// before the clock starts (see cmd/istioload), so what is measured is the
// CA's throughput seen through Istio's client, not key generation.
//
// Two baselines are measured in the same run, each alternated with the
// clients in benchRounds rounds, in this process from as many goroutines as
// there are clients, on the CSR the clients send:
//   - the baseline (the "in-process parse+sign"): trustbridge's own
//     ca.ParseCSR and ca.SignX509SVID, as ca/certservice's baseline-parse-sign, with
//     an ECDSA P-256 CA key;
//   - the stdlib baseline, the work any CA must do per request in bare
//     crypto/x509: decode the PEM CSR, parse it, check its signature (proof
//     of possession), and create a leaf for the CSR's SPIFFE ID (a random
//     128-bit serial, the subject key identifier computed per call), as
//     ca's BenchmarkSign "baseline:raw" does.
//
// The two cost about the same, so the gap to either is what the service,
// gRPC, TLS and the second process add, not the CA's own checks.
//
// Metrics: certs/s (the clients' timed part) and ns/op from it,
// baseline-certs/s, x-baseline-certs/s (the ratio of the two: the issue's
// goal is at least 0.70 at 8 clients), x-stdlib-certs/s (the same against
// the stdlib baseline), and CPU time per certificate of the server
// (server-cpu-us/cert, from /proc), of the client process
// (client-cpu-us/cert) and of each baseline (baseline-cpu-us/cert,
// stdlib-cpu-us/cert): on a machine with fewer cores than clients,
// throughput is bounded by the sum of the first two. x-baseline-cpu is the
// server's CPU per certificate over the baseline's (issue 40's goal: at
// most 1.3), which the core count does not bound.
func BenchmarkIstioClientThroughput(b *testing.B) {
	bin := os.Getenv("TRUSTBRIDGE_BIN")
	if bin == "" {
		b.Skip("TRUSTBRIDGE_BIN is unset: run make bench-istio, or set it to a trustbridge binary")
	}
	dir := b.TempDir()
	load := buildLoadClient(b, dir)
	srv := startBenchServer(b, bin, dir)
	base := newBaselineCA(b)

	for _, clients := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("clients-%d", clients), func(b *testing.B) {
			b.StopTimer()
			var istio, baseline, stdlib loadResult
			var serverCPU time.Duration
			for r := range benchRounds {
				n := b.N/benchRounds + boolInt(r < b.N%benchRounds)
				if n == 0 {
					continue
				}
				baseline.add(base.run(b, base.signOurs, clients, n))
				stdlib.add(base.run(b, base.signStdlib, clients, n))
				cpu0 := srv.cpuTime(b)
				istio.add(srv.load(b, load, clients, n))
				serverCPU += srv.cpuTime(b) - cpu0
			}
			certs := float64(istio.Certs)
			b.ReportMetric(istio.Seconds*1e9/certs, "ns/op")
			b.ReportMetric(certs/istio.Seconds, "certs/s")
			b.ReportMetric(baseline.rate(), "baseline-certs/s")
			b.ReportMetric(certs/istio.Seconds/baseline.rate(), "x-baseline-certs/s")
			b.ReportMetric(certs/istio.Seconds/stdlib.rate(), "x-stdlib-certs/s")
			b.ReportMetric(float64(serverCPU.Microseconds())/certs, "server-cpu-us/cert")
			b.ReportMetric(float64(serverCPU.Microseconds())/certs/(baseline.CPUMicros/float64(baseline.Certs)), "x-baseline-cpu")
			b.ReportMetric(istio.CPUMicros/certs, "client-cpu-us/cert")
			b.ReportMetric(baseline.CPUMicros/float64(baseline.Certs), "baseline-cpu-us/cert")
			b.ReportMetric(stdlib.CPUMicros/float64(stdlib.Certs), "stdlib-cpu-us/cert")
		})
	}
}

func boolInt(v bool) int {
	if v {
		return 1
	}
	return 0
}

// loadResult is cmd/istioload's output line, and the baseline's in the same
// shape; add sums rounds.
type loadResult struct {
	Certs     int     `json:"certs"`
	Seconds   float64 `json:"seconds"`
	CPUMicros float64 // over all certs
	PerCert   float64 `json:"cpu_us_per_cert"`
}

// rate is certificates a second.
func (r *loadResult) rate() float64 { return float64(r.Certs) / r.Seconds }

func (r *loadResult) add(o loadResult) {
	r.Certs += o.Certs
	r.Seconds += o.Seconds
	r.CPUMicros += o.PerCert * float64(o.Certs)
}

// buildLoadClient builds cmd/istioload into dir, before any timing.
func buildLoadClient(b *testing.B, dir string) string {
	b.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		b.Fatalf("go is needed to build cmd/istioload: %v", err)
	}
	out := filepath.Join(dir, "istioload")
	if msg, err := exec.Command(goBin, "build", "-o", out, "./cmd/istioload").CombinedOutput(); err != nil {
		b.Fatalf("go build ./cmd/istioload: %v\n%s", err, msg)
	}
	return out
}

// benchServer is a running `trustbridge server` whose certificate service
// takes a bootstrap token, with what a client needs to call it.
type benchServer struct {
	pid       int
	grpcAddr  string
	rootCert  string // PEM file of the CA's roots
	tokenFile string
}

// startBenchServer is startAgentCA for a benchmark: the same server, at
// log level warn, since a log line per certificate would be part of the
// measurement.
func startBenchServer(b *testing.B, bin, dir string) *benchServer {
	b.Helper()
	// The default log level: the start-up records that name the listeners
	// are info records, and a server's issuance log is part of its cost.
	srv, agent := startAgentCA(b, bin, dir)
	return &benchServer{pid: srv.pid, grpcAddr: srv.grpcAddr, rootCert: agent.caRootFile(b), tokenFile: agent.jwtFile}
}

// load runs cmd/istioload once: n certificates from this many clients.
func (s *benchServer) load(b *testing.B, bin string, clients, n int) loadResult {
	b.Helper()
	cmd := exec.Command(bin,
		"-addr", s.grpcAddr, "-root-cert", s.rootCert, "-token-file", s.tokenFile,
		"-trust-domain", trustDomain, "-namespace", namespace, "-service-account", account,
		"-clients", strconv.Itoa(clients), "-n", strconv.Itoa(n))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b.StartTimer()
	out, err := cmd.Output()
	b.StopTimer()
	if err != nil {
		b.Fatalf("istioload: %v\n%s", err, stderr.Bytes())
	}
	var r loadResult
	if err := json.Unmarshal(out, &r); err != nil || r.Certs != n || r.Seconds <= 0 {
		b.Fatalf("istioload printed %q (%v), want a result for %d certificates", out, err, n)
	}
	return r
}

// cpuTime is the server's user and system CPU time so far, from
// /proc/<pid>/stat (fields 14 and 15, in clock ticks of 10ms on Linux).
func (s *benchServer) cpuTime(b *testing.B) time.Duration {
	b.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.pid))
	if err != nil {
		b.Fatalf("server CPU time: %v", err)
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(fields) < 13 {
		b.Fatalf("server CPU time: short /proc stat %q", stat)
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("server CPU time: /proc stat %q", stat)
	}
	const tick = 10 * time.Millisecond // USER_HZ, 100 on every Linux ABI Go supports
	return time.Duration(utime+stime) * tick
}

// baselineCA holds what the baselines sign with and what they sign.
type baselineCA struct {
	cert     *x509.Certificate
	key      *ecdsa.PrivateKey
	csr      []byte // PEM, from Istio's GenCSR as the clients send
	material ca.SigningMaterial
	policy   ca.Policy
	id       spiffeid.ID
}

func newBaselineCA(b *testing.B) *baselineCA {
	b.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{Organization: []string{trustDomain}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		b.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		b.Fatal(err)
	}
	csr, _, err := pkiutil.GenCSR(pkiutil.CertOptions{
		Host:     fmt.Sprintf("spiffe://%s/ns/%s/sa/%s", trustDomain, namespace, account),
		ECSigAlg: pkiutil.EcdsaSigAlg,
		ECCCurve: pkiutil.P256Curve,
	})
	if err != nil {
		b.Fatal(err)
	}
	id, err := spiffeid.FromPathf(spiffeid.RequireTrustDomainFromString(trustDomain), "/ns/%s/sa/%s", namespace, account)
	if err != nil {
		b.Fatal(err)
	}
	return &baselineCA{
		cert: cert, key: key, csr: csr,
		material: ca.SigningMaterial{Cert: cert, Key: key, Roots: []*x509.Certificate{cert}},
		policy:   ca.Policy{TrustDomain: id.TrustDomain()},
		id:       id,
	}
}

var serialLimit = new(big.Int).Lsh(big.NewInt(1), 128)

// signStdlib is the stricter baseline's unit of work: bare crypto/x509.
func (c *baselineCA) signStdlib() error {
	block, _ := pem.Decode(c.csr)
	if block == nil {
		return fmt.Errorf("baseline: no PEM CSR")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return err
	}
	if err := csr.CheckSignature(); err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, serialLimit)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(csr.PublicKey)
	if err != nil {
		return err
	}
	skid := sha256.Sum256(pub)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		NotBefore:             now.Add(-10 * time.Second),
		NotAfter:              now.Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		URIs:                  csr.URIs,
		SubjectKeyId:          skid[:20],
	}
	_, err = x509.CreateCertificate(rand.Reader, tmpl, c.cert, csr.PublicKey, c.key)
	return err
}

// signOurs is trustbridge's own parse and sign, as ca/certservice's
// baseline-parse-sign.
func (c *baselineCA) signOurs() error {
	csr, err := ca.ParseCSR(c.csr)
	if err != nil {
		return err
	}
	_, err = ca.SignX509SVID(time.Now(), c.material, c.policy, ca.X509SVIDParams{PublicKey: csr.PublicKey, SPIFFEID: c.id, TTL: time.Hour})
	return err
}

// run signs n certificates from this many goroutines and reports the time
// and this process's CPU time they took.
func (c *baselineCA) run(b *testing.B, sign func() error, workers, n int) loadResult {
	b.Helper()
	var next atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	cpu0 := processCPU()
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if err := sign(); err != nil {
					failed.Store(&err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := processCPU() - cpu0
	if err := failed.Load(); err != nil {
		b.Fatalf("baseline: %v", *err)
	}
	return loadResult{Certs: n, Seconds: elapsed.Seconds(), PerCert: float64(cpu.Microseconds()) / float64(n)}
}

// processCPU is this process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
