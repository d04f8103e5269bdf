package cluster

import (
	"errors"
	"strings"
	"testing"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/node"
)

func TestListenHost(t *testing.T) {
	const secret = "0123456789abcdef"
	tests := []struct {
		name     string
		cfg      config.Config
		host     string
		warn     string // substring; "" for none
		errNames string // the variable a configuration error names
	}{
		{"loopback, no secret", config.Config{Role: node.Worker, RootURI: "127.0.0.1", NodeHost: "127.0.0.1"}, "127.0.0.1", "FPT_CLUSTER_SECRET", ""},
		{"localhost scheduler, no secret", config.Config{Role: node.Scheduler, RootURI: "localhost"}, "127.0.0.1", "protected mode", ""},
		{"remote node, no secret", config.Config{Role: node.Worker, RootURI: "127.0.0.1", NodeHost: "198.18.0.2"}, "", "", "FPT_CLUSTER_SECRET"},
		{"remote scheduler, no secret", config.Config{Role: node.Scheduler, RootURI: "198.18.0.1"}, "", "", "FPT_CLUSTER_SECRET"},
		{"remote, insecure", config.Config{Role: node.Worker, RootURI: "198.18.0.1", NodeHost: "198.18.0.2", Insecure: true}, "0.0.0.0", "FPT_INSECURE", ""},
		{"loopback, secret", config.Config{Role: node.Server, RootURI: "127.0.0.1", NodeHost: "127.0.0.1", Secret: secret}, "127.0.0.1", "", ""},
		{"not this machine's, secret", config.Config{Role: node.Server, RootURI: "198.18.0.1", NodeHost: "198.18.0.2", Secret: secret}, "0.0.0.0", "", ""},
	}
	for _, tt := range tests {
		host, warn, err := ListenHost(tt.cfg)
		if tt.errNames != "" {
			var ve *config.VarError
			if !errors.As(err, &ve) || ve.Var != tt.errNames {
				t.Errorf("%s: err %v; want a configuration error naming %s", tt.name, err, tt.errNames)
			}
			continue
		}
		if err != nil || host != tt.host {
			t.Errorf("%s: %q, %v; want %q", tt.name, host, err, tt.host)
		}
		if (tt.warn == "") != (warn == "") || !strings.Contains(warn, tt.warn) {
			t.Errorf("%s: warning %q; want one saying %q", tt.name, warn, tt.warn)
		}
	}
}
