package cluster

import (
	"fmt"
	"net"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/node"
)

// ListenHost is the IP address a node's sockets (control ROUTER and van)
// bind, and a warning to log once at start ("" when none):
//
//   - with a secret, the address the node is reached at (DMLC_NODE_HOST or
//     the resolved host; DMLC_PS_ROOT_URI for the scheduler) when it is one
//     of this machine's, else every interface (behind NAT, say), where the
//     secret still keeps strangers out;
//   - without one, protected mode: loopback only, and a configuration error
//     (config.VarError naming FPT_CLUSTER_SECRET, exit 2) when the job is
//     not on loopback;
//   - without one but with FPT_INSECURE=1, every interface, with a warning.
func ListenHost(cfg config.Config) (host, warning string, err error) {
	advertised := cfg.RootURI
	if cfg.Role != node.Scheduler {
		if advertised, err = cfg.ResolveHost(); err != nil {
			return "", "", err
		}
	}
	switch {
	case cfg.Secret != "":
		ip, err := resolve(advertised)
		if err != nil || !isLocal(ip) {
			return "0.0.0.0", "", nil
		}
		return ip.String(), "", nil
	case cfg.Insecure:
		return "0.0.0.0", "FPT_INSECURE=1: no cluster secret, listening on every interface: anyone who can reach this host can stop the job or change its values", nil
	}
	for _, h := range []struct{ name, v string }{{"DMLC_PS_ROOT_URI", cfg.RootURI}, {"DMLC_NODE_HOST", advertised}} {
		if ip, err := resolve(h.v); err != nil || !ip.IsLoopback() {
			return "", "", &config.VarError{Var: "FPT_CLUSTER_SECRET", Reason: fmt.Sprintf(
				"not set, and %s=%s is not a loopback address: a job across machines needs the same secret on every node "+
					"(export FPT_CLUSTER_SECRET=$(openssl rand -hex 16), or FPT_CLUSTER_SECRET_FILE), or FPT_INSECURE=1 to run unauthenticated", h.name, h.v)}
		}
	}
	ip, _ := resolve(advertised)
	return ip.String(), "no FPT_CLUSTER_SECRET: protected mode, listening on loopback only; for a job across machines give every node the same FPT_CLUSTER_SECRET (e.g. openssl rand -hex 16) or FPT_CLUSTER_SECRET_FILE", nil
}

// resolve turns a host into one IP address, IPv4 first.
func resolve(host string) (net.IP, error) {
	if ip := net.ParseIP(host); ip != nil {
		return ip, nil
	}
	ips, err := net.LookupIP(host)
	if err != nil {
		return nil, fmt.Errorf("resolve %q: %w", host, err)
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("resolve %q: no address", host)
	}
	for _, ip := range ips {
		if ip.To4() != nil {
			return ip, nil
		}
	}
	return ips[0], nil
}

// isLocal reports whether ip is one of this machine's addresses.
func isLocal(ip net.IP) bool {
	if ip.IsLoopback() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}
