"""Learning: the default job (`troupe run` with its embedded defaults) takes the validation
loss from about ln(256) = 5.5 nats/byte to below 2.5 on the default corpus."""

import math

from harness import fail, main, run_to_end


def test():
    code, events, output = run_to_end(["--metrics-port", "0", "--no-progress"], timeout=1800)
    print(output[-1500:])
    if code != 0:
        fail(f"default run exited {code}")
    steps = [e for e in events if e.get("event") == "step"]
    vals = [e for e in events if e.get("event") == "validation"]
    if not steps or not vals:
        fail("no step or validation events")
    first = steps[0]["loss"]
    final_val = vals[-1]["val_loss"]
    print(f"first step loss {first:.4f} (ln 256 = {math.log(256):.4f}); final validation loss {final_val:.4f}")
    if abs(first - math.log(256)) > 0.5:
        fail(f"the first loss {first:.3f} is not near ln(256): is the initialisation right?")
    if final_val >= 2.5:
        fail(f"final validation loss {final_val:.3f} is not below 2.5")
    if "validation loss" not in output or "tokens/s" not in output:
        fail("the summary is missing")


if __name__ == "__main__":
    main(test)
