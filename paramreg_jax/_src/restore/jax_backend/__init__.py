"""The JAX backend (``JaxBackend``): how weights become sharded ``jax.Array``s. A plan's
boxes become reads grouped into windows (``reads.py``), built on threads within the memory
budget (``windows.py``; small tensors by ``direct.py``), handed to the devices
(``transfer.py``, ``handover.py``). The backend-neutral pipeline beside this folder
(``planning``, ``materialize``, ``bind``) calls it only through ``contract.ParameterBackend``;
another backend is a folder like this one."""
