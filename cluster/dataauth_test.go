package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/fptps/fpt/auth"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/internal/memcluster"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/van/vantest"
)

// A data connection from outside the table, without the secret, or from
// the node that should not dial is refused by the member it reaches: no
// frame gets in, nobody fails, and the job ends normally.
func TestDataPlaneRefusesStrangers(t *testing.T) {
	const secret = "sixteen bytes or more of secret"
	c, err := memcluster.Start(context.Background(), memcluster.Options{Servers: 1, Workers: 1,
		Env: map[string]string{"FPT_CLUSTER_SECRET": secret}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key, err := auth.HelloKey(secret)
	if err != nil {
		t.Fatal(err)
	}
	server, worker := node.ServerID(0), node.WorkerID(0)
	addr := func(id node.ID) string {
		info, _ := c.Member(server).Info(id)
		return info.DataAddr()
	}
	probes := []struct {
		name     string
		self, to node.ID
		key      []byte
	}{
		{"an id outside the table", node.WorkerID(5), server, key},
		{"a member's id without the secret", server, worker, nil},
		{"a member's id with a wrong secret", server, worker, vantest.Key(7)},
		{"the node that should not dial", worker, server, key},
	}
	for _, p := range probes {
		v, col := vantest.NewVan(t, func(cfg van.Config) (van.Transport, error) { return c.Data.Listen(cfg) }, p.self,
			func(cfg *van.Config) { cfg.HelloKey = p.key })
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := v.Dial(ctx, p.to, addr(p.to)); err == nil {
			v.Send(&frame.Message{Header: frame.Header{Type: frame.Push, DType: frame.Float32, Sender: uint32(p.self), Recipient: uint32(p.to), Total: 4}, Payload: make([]byte, 4)})
			col.WaitLost(t, 1) // the member hung up
		}
		cancel()
	}
	for _, id := range []node.ID{server, worker} {
		if err := c.Member(id).Err(); err != nil {
			t.Fatalf("%s failed: %v", id, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Finish(ctx); err != nil {
		t.Fatal(err)
	}
}
