package agent

import (
	"context"
	"path/filepath"
	"testing"

	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

func TestCheckSocket(t *testing.T) {
	tests := []struct {
		name    string
		serve   func() *grpc.Server // nil: nothing on the socket
		already bool
		wantErr string
	}{
		{name: "nothing", serve: nil},
		{name: "sds", serve: func() *grpc.Server {
			gs := grpc.NewServer()
			secretv3.RegisterSecretDiscoveryServiceServer(gs, streamOnlySDS{})
			return gs
		}, already: true},
		{name: "other grpc", serve: func() *grpc.Server { return grpc.NewServer() }, wantErr: "without SDS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sock := filepath.Join(shortDir(t), "socket")
			if tt.serve != nil {
				serveOn(t, tt.serve(), sock)
			}
			err := newTestAgent(t, Config{SocketPath: sock, CredentialsDir: t.TempDir()}).CheckSocket(context.Background())
			switch {
			case tt.already:
				require.ErrorIs(t, err, ErrAlreadyServing)
				assert.Contains(t, err.Error(), sock)
			case tt.wantErr != "":
				require.Error(t, err)
				assert.NotErrorIs(t, err, ErrAlreadyServing)
				assert.Contains(t, err.Error(), tt.wantErr)
			default:
				require.NoError(t, err)
			}
		})
	}
}
