"""Throwaway mutual-TLS material for hosts named by their addresses (EC P-256, valid 2 days):
ca.pem, and per host NAME.pem / NAME.key with subjectAltName IP:ADDRESS, good for serving and
for connecting (a worker is the coordinator's client and its peers' server), and `token`, a
job API token."""
import os
import subprocess


def _ossl(*args, cwd):
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"openssl {args[0]}: {r.stderr.strip()[-500:]}")


def make_host_certs(dirname, hosts):
    """hosts: {name: address}."""
    os.makedirs(dirname, exist_ok=True)
    key = ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out"]
    _ossl(*key, "ca.key", cwd=dirname)
    _ossl("req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=adjsh-hosts-ca", "-days", "2",
          "-out", "ca.pem", "-addext", "basicConstraints=critical,CA:TRUE", "-addext",
          "keyUsage=critical,keyCertSign,cRLSign", cwd=dirname)
    for name, addr in hosts.items():
        _ossl(*key, f"{name}.key", cwd=dirname)
        _ossl("req", "-new", "-key", f"{name}.key", "-subj", f"/CN=adjsh-{name}", "-out",
              f"{name}.csr", cwd=dirname)
        with open(os.path.join(dirname, f"{name}.ext"), "w") as f:
            f.write(f"subjectAltName=IP:{addr}\nextendedKeyUsage=serverAuth,clientAuth\n"
                    "basicConstraints=CA:FALSE\n")
        _ossl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
              "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem",
              cwd=dirname)
    with open(os.path.join(dirname, "token"), "w") as f:
        f.write(os.urandom(16).hex() + "\n")
    os.chmod(os.path.join(dirname, "token"), 0o600)
