// Command workload-api is the README's go-spiffe example: a workload that
// gets its X509-SVID, its trust bundles and a JWT-SVID from `trustbridge
// agent` over the SPIFFE Workload API, then calls a workload of a
// federated trust domain over mTLS, sending the JWT-SVID along.
//
//	SPIFFE_ENDPOINT_SOCKET=unix:///path/to/workload-api.sock \
//	    go run ./docs/examples/workload-api https://127.0.0.1:8080/ west.example
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
)

func main() {
	if len(os.Args) != 3 {
		log.Fatal("usage: workload-api URL PEER_TRUST_DOMAIN")
	}
	url, peer := os.Args[1], spiffeid.RequireTrustDomainFromString(os.Args[2])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The socket comes from SPIFFE_ENDPOINT_SOCKET. The source follows
	// rotations and federated bundle changes for as long as it is open.
	x509Source, err := workloadapi.NewX509Source(ctx)
	if err != nil {
		log.Fatalf("X.509 source: %v", err)
	}
	defer x509Source.Close()
	svid, err := x509Source.GetX509SVID()
	if err != nil {
		log.Fatalf("X509-SVID: %v", err)
	}
	fmt.Println("I am", svid.ID)

	jwtSource, err := workloadapi.NewJWTSource(ctx)
	if err != nil {
		log.Fatalf("JWT source: %v", err)
	}
	defer jwtSource.Close()
	token, err := jwtSource.FetchJWTSVID(ctx, jwtsvid.Params{Audience: url})
	if err != nil {
		log.Fatalf("JWT-SVID: %v", err)
	}

	// mTLS with any workload of the peer trust domain, verified against
	// that trust domain's roots only.
	tlsConfig := tlsconfig.MTLSClientConfig(x509Source, x509Source, tlsconfig.AuthorizeMemberOf(peer))
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		log.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token.Marshal())
	resp, err := client.Do(req)
	if err != nil {
		log.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s answered %s: %s\n", url, resp.Status, body)
}
