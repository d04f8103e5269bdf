package config_test

import (
	"fmt"

	"github.com/fptps/fpt/config"
)

func ExampleFromEnv() {
	env := map[string]string{
		"DMLC_ROLE":         "server",
		"DMLC_PS_ROOT_URI":  "10.0.0.1",
		"DMLC_PS_ROOT_PORT": "9000",
		"DMLC_NUM_SERVER":   "2",
		"DMLC_NUM_WORKER":   "two",
	}
	_, err := config.FromEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	fmt.Println(err)

	env["DMLC_NUM_WORKER"] = "4"
	cfg, err := config.FromEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	fmt.Println(cfg.Role, cfg.SchedulerEndpoint(), cfg.NumWorkers, cfg.Van, err)
	// Output:
	// DMLC_NUM_WORKER="two": must be an integer from 1 to 32768
	// server tcp://10.0.0.1:9000 4 epoll <nil>
}
